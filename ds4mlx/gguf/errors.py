"""The one exception type for bad model files."""


class GGUFError(Exception):
    """A GGUF file is malformed, truncated, unsupported or does not fit its architecture.

    The message always names the file and, where it applies, the tensor or metadata key.
    """
