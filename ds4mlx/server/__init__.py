"""ds4-server: OpenAI- and Anthropic-compatible HTTP endpoints over the generation API."""

from ds4mlx.server.app import ServerConfig, create_app
from ds4mlx.server.generation import GenerationDefaults, GenerationService
from ds4mlx.server.queue import GenerationQueue

__all__ = [
    "GenerationDefaults",
    "GenerationQueue",
    "GenerationService",
    "ServerConfig",
    "create_app",
]
