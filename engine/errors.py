"""Typed errors raised by the engine.

Every error that comes from a caller's input names the offending parameter in
``param`` so that the serving layer can turn it into an OpenAI-style error
object without parsing messages.
"""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidParameterError(EngineError, ValueError):
    """A request or configuration parameter has a value the engine cannot use."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class ContextLengthExceededError(InvalidParameterError):
    """The prompt plus the requested completion can never fit the model or the KV cache."""

    code = "context_length_exceeded"

    def __init__(self, message: str, param: str = "prompt"):
        super().__init__(param, message)


class ModelLoadError(EngineError):
    """A checkpoint could not be found, parsed or mapped onto a supported architecture."""


class RequestNotFoundError(EngineError, KeyError):
    """An operation named a request id the engine does not know."""
