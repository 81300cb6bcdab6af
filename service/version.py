"""The compiler version: part of every store key and every program's stats."""
from importlib import metadata

try:
    COMPILER_VERSION = metadata.version("sticksat")
except metadata.PackageNotFoundError:  # running from a source tree without install
    COMPILER_VERSION = "0.0.0+source"
