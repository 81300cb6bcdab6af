"""A naming-independent form of a graph document.

The same computation captured two ways gets different ids: Dynamo + AOTAutograd names
inputs `arg0_1`, ... in first-use order, torch.export names them `p_fc_weight`, `x`
with parameters first. `canonical_document` renames inputs `in<k>` in the order of their
first use by a node (then by the graph outputs), drops inputs nothing uses (torch.export
keeps every parameter and buffer, e.g. BatchNorm's `num_batches_tracked`; Dynamo lifts
only the used ones), and renames nodes `n<k>` in document order. Two documents describing
the same op sequence over the same inputs then compare (and hash) equal. It is a view
for comparison: executing a document uses its own ids and input order.
"""
from __future__ import annotations

from lowering.graph_format import GraphDocument, ListArg, TensorRef
from lowering.validate import iter_tensor_refs


def _first_use_order(doc: GraphDocument) -> list[str]:
    input_ids = {i.id for i in doc.inputs}
    order: list[str] = []
    seen: set[str] = set()

    def visit(ref: TensorRef) -> None:
        if ref.node in input_ids and ref.node not in seen:
            seen.add(ref.node)
            order.append(ref.node)

    for node in doc.nodes:
        for ref in iter_tensor_refs(list(node.args)):
            visit(ref)
        for key in sorted(node.kwargs):
            for ref in iter_tensor_refs([node.kwargs[key]]):
                visit(ref)
    for ref in doc.outputs:
        visit(ref)
    return order


def canonical_document(doc: GraphDocument) -> GraphDocument:
    """The document with canonical ids and input order (labels kept)."""
    order = _first_use_order(doc)
    rename = {old: f"in{k}" for k, old in enumerate(order)}
    rename.update({node.id: f"n{k}" for k, node in enumerate(doc.nodes)})
    by_id = {i.id: i for i in doc.inputs}

    def ref(r: TensorRef) -> TensorRef:
        return r.model_copy(update={"node": rename.get(r.node, r.node)})

    def arg(a):
        if isinstance(a, TensorRef):
            return ref(a)
        if isinstance(a, ListArg):
            return a.model_copy(update={"items": [arg(x) for x in a.items]})
        return a

    inputs = [by_id[old].model_copy(update={"id": rename[old]}) for old in order]
    nodes = [n.model_copy(update={"id": rename[n.id], "args": [arg(a) for a in n.args],
                                  "kwargs": {k: arg(v) for k, v in n.kwargs.items()}}) for n in doc.nodes]
    outputs = [ref(r) for r in doc.outputs]
    # Re-validated so the result is a document like any other.
    return GraphDocument.model_validate(doc.model_copy(update={"inputs": inputs, "nodes": nodes,
                                                               "outputs": outputs}).model_dump())


def canonical_hash(doc: GraphDocument) -> str:
    """graph_hash of the canonical form: equal for the same computation captured with
    different names (e.g. through torch.compile and through torch.export)."""
    return canonical_document(doc).graph_hash()
