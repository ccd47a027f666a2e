"""One exception type for bad input, so stages can print a single clear line and exit non-zero."""


class FedreproError(Exception):
    """Bad input: the message names the file, field or parameter, the bad value and what is allowed."""


class ConfigError(FedreproError):
    """A parameter in params.yaml is missing, unknown or out of range."""


class DataError(FedreproError):
    """A data file is missing, corrupted or does not have the expected shape."""
