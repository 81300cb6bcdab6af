"""The hardware description: loading, provenance checks, digest, derived rates."""
import copy
import json

import pytest

from target.hardware import (HardwareError, TARGETS_DIR, hardware_from_dict, list_targets,
                                load_target)


def _doc() -> dict:
    return json.loads((TARGETS_DIR / "spyre.json").read_text())


def test_spyre_target_facts():
    hw = load_target("spyre")
    assert hw.name == "spyre"
    assert (hw.cores, hw.corelets_per_core, hw.pt_array) == (32, 2, (8, 8))
    assert hw.stick_bytes == 128
    assert hw.lx_bytes_per_core == 2 * 1024 * 1024
    assert hw.lx_capacity_bytes == 1_589_376
    assert hw.bundle_tensor_limit == 6 and "program input or output" in hw.bundle_tensor_limit_counts
    assert hw.bundle_tensor_limit_rule == "non_intermediate"
    assert hw.lx_persists_across_bundles is True
    assert hw.per_core_span_bytes == 256 * 1024 * 1024
    assert hw.elems_per_stick("float16") == 64
    assert hw.elems_per_stick("float32") == 32
    assert hw.elems_per_stick("int8") == 128
    assert "spyre" in list_targets()


def test_every_parameter_has_a_source_or_reasoned_assumption():
    hw = load_target()
    for key, prov in hw.provenance.items():
        assert prov.get("source") or (prov.get("assumption") is True and prov.get("reasoning")), key
    # the clock is not published: it must be marked as an assumption
    assert hw.provenance["clock_ghz"]["assumption"] is True


def test_digest_is_sha256_of_canonical_json_and_changes_with_content():
    hw = load_target()
    assert len(hw.digest) == 64
    doc = _doc()
    assert hardware_from_dict(copy.deepcopy(doc)).digest == hw.digest
    doc["params"]["cores"]["value"] = 16
    other = hardware_from_dict(doc)
    assert other.cores == 16 and other.digest != hw.digest


def test_number_without_source_is_rejected():
    doc = _doc()
    del doc["params"]["restickify_gbps"]["source"]
    with pytest.raises(HardwareError, match="restickify_gbps"):
        hardware_from_dict(doc)
    doc = _doc()
    doc["params"]["clock_ghz"].pop("reasoning")
    with pytest.raises(HardwareError, match="clock_ghz"):
        hardware_from_dict(doc)


def test_unknown_missing_and_inconsistent_parameters_are_rejected():
    doc = _doc()
    doc["params"]["warp_drive"] = {"value": 1, "unit": "x", "source": "none"}
    with pytest.raises(HardwareError, match="unknown"):
        hardware_from_dict(doc)
    doc = _doc()
    del doc["params"]["cores"]
    with pytest.raises(HardwareError, match="missing"):
        hardware_from_dict(doc)
    doc = _doc()
    doc["params"]["lx_capacity_bytes"]["value"] = 3 * 1024 * 1024
    with pytest.raises(HardwareError, match="lx_capacity"):
        hardware_from_dict(doc)
    doc = _doc()
    doc["params"]["cores"]["value"] = 32.5
    with pytest.raises(HardwareError, match="integer"):
        hardware_from_dict(doc)


def test_unknown_target_and_path_loading(tmp_path):
    with pytest.raises(HardwareError, match="unknown target"):
        load_target("nosuchchip")
    doc = _doc()
    doc["name"] = "spyre16"
    doc["params"]["cores"]["value"] = 16
    p = tmp_path / "spyre16.json"
    p.write_text(json.dumps(doc))
    hw = load_target(str(p))
    assert hw.name == "spyre16" and hw.cores == 16


def test_derived_rates():
    hw = load_target()
    # balanced read+write runs at the measured ~105 GB/s, one-way at 150
    x = 1_000_000
    assert 2 * x / hw.dram_ns(x, x) == pytest.approx(hw.dram_balanced_gbps, rel=1e-3)
    assert x / hw.dram_ns(x, 0) == pytest.approx(150.0)
    # reduction read curve: capped at 150 for few rows, ~114 for many
    assert hw.reduction_read_curve.gbps(100) == 150.0
    assert hw.reduction_read_curve.gbps(100_000) == pytest.approx(114.0, abs=0.01)
    assert hw.spill_derate(256 * 1024) == 1.0
    assert hw.spill_derate(4 * 512 * 1024) == pytest.approx(0.25 ** hw.lx_spill_exponent)
    assert hw.spill_derate(4 * 512 * 1024) < 1.0
    uf = hw.underfill_curve
    assert uf.efficiency(4096, 4096) == 1.0
    assert uf.efficiency(2, 2048) == pytest.approx((2 / 7.9) ** 0.5)
    assert 0 < uf.efficiency(0.01, 128) < uf.eff_floor
    assert hw.ring_gbps_per_direction == pytest.approx(128 * hw.clock_ghz)
    assert hw.pt_mac_per_ns("float16") < hw.pt_mac_per_ns("float16", "peak")
    # operand order: no stall for one batch, inputs add, the output drain overlaps them
    assert hw.pt_layout_stall_ns_per_mac(2, True, 1) == 0.0
    assert hw.pt_layout_stall_ns_per_mac(1, False, 8) < hw.pt_layout_stall_ns_per_mac(2, False, 8) \
        == pytest.approx(hw.pt_layout_stall_ns_per_mac(2, True, 8))
    assert hw.pt_pass_efficiency(64) == 1.0
    assert hw.pt_pass_efficiency(8) == pytest.approx((1 / 8) ** 0.5)


def test_bundle_rule_and_lx_persistence():
    hw = load_target()
    # program inputs/outputs count one each, all device-memory intermediates one together
    assert hw.bundle_slots({"x", "w", "t1", "t2"}, {"x", "w", "o"}, pool=True) == 3
    assert hw.bundle_slots({"x", "w", "t1", "t2"}, {"x", "w", "o"}, pool=False) == 2
    assert "PR #3683" in hw.provenance["lx_persists_across_bundles"]["source"]
    doc = _doc()
    doc["params"]["bundle_tensor_limit"]["rule"] = "device_memory"
    assert hardware_from_dict(doc).bundle_slots({"x", "w", "t1", "t2"}, {"x"}, pool=True) == 4
    doc["params"]["bundle_tensor_limit"]["rule"] = "none"
    assert hardware_from_dict(doc).bundle_slots({"x", "w"}, {"x", "w"}, pool=True) == 0
    doc["params"]["bundle_tensor_limit"]["rule"] = "segments"
    with pytest.raises(HardwareError, match="rule"):
        hardware_from_dict(doc)
    # an older target file without the new keys keeps its old meaning
    doc = _doc()
    del doc["params"]["lx_persists_across_bundles"], doc["params"]["bundle_tensor_limit"]["rule"]
    old = hardware_from_dict(doc)
    assert old.lx_persists_across_bundles is False and old.bundle_tensor_limit_rule == "device_memory"
    doc = _doc()
    doc["params"]["lx_persists_across_bundles"]["value"] = 1
    with pytest.raises(HardwareError, match="true or false"):
        hardware_from_dict(doc)
    doc = _doc()
    del doc["params"]["lx_persists_across_bundles"]["source"]
    with pytest.raises(HardwareError, match="source"):
        hardware_from_dict(doc)
