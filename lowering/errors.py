"""One error type for everything wrong with a client's graph: a stable code, a message,
and the node it concerns. The service turns it into a 422 problem+json."""
from __future__ import annotations


class GraphError(ValueError):
    def __init__(self, code: str, message: str, node: str | None = None):
        self.code = code
        self.message = message
        self.node = node
        super().__init__(f"[{code}] {message}" + (f" (node {node})" if node else ""))

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "node": self.node}
