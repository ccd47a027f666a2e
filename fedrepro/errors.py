"""One exception type for bad input or a run that cannot go on, so stages can print a single clear line and exit
non-zero."""


class FedreproError(Exception):
    """Bad input: the message names the file, field or parameter, the bad value and what is allowed."""


class ConfigError(FedreproError):
    """A parameter in params.yaml is missing, unknown or out of range."""


class DataError(FedreproError):
    """A data file is missing, corrupted or does not have the expected shape."""


class FederationError(FedreproError):
    """The federation cannot go on: nodes missing or answering for the wrong clients, or a round with no update."""


class TrainingDiverged(FedreproError):
    """A client's own local training reached a non-finite loss; the message names the client, the round and the step."""
