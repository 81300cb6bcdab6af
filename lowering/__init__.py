"""Graph interchange format, validation, the aten -> primitive loop-nest lowering and its
numpy reference interpreter."""
from target.interpreter import interpret
from lowering.lower import SUPPORTED_TARGETS, lower_document, node_supported

__all__ = ["SUPPORTED_TARGETS", "interpret", "lower_document", "node_supported"]
