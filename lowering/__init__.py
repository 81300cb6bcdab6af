"""Graph interchange format, validation and the aten -> primitive loop-nest lowering."""
from lowering.lower import SUPPORTED_TARGETS, lower_document, node_supported

__all__ = ["SUPPORTED_TARGETS", "lower_document", "node_supported"]
