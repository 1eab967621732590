"""GGUF → hyper-parameters + weight arrays (the first room of gguf → ir → lower → artifact → runtime)."""
from .gguf_file import GGUFFile, Weight

__all__ = ["GGUFFile", "Weight"]
