"""Tables, figures and the markdown report, built only from what the pipeline wrote."""
