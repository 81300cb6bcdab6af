"""The compiler version: part of every store key and every program's stats. Lives in
`lowering` (the package every service-side package may import) so the solver can stamp
programs without importing `service`."""
from importlib import metadata

try:
    COMPILER_VERSION = metadata.version("sticksat")
except metadata.PackageNotFoundError:  # running from a source tree without install
    COMPILER_VERSION = "0.0.0+source"
