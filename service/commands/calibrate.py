"""`sticksat calibrate [--json] [--plot FILE] [--fit [--write]]`: every calibration point
rebuilt as the plan its source recorded, measured vs simulated, errors per family,
leave-one-source-out, the reserved validation points and the held-out sources on their own
(never fitted)
(calibration/; format in docs/calibration.md)."""
from __future__ import annotations

import datetime as _dt
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="compare the timing model with every public device measurement")
    p.add_argument("--dataset", default=None, help="calibration dataset JSON (default: the bundled one)")
    p.add_argument("--target", default="spyre", help="hardware target name")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", default=None, metavar="FILE", help="write measured vs simulated (log axes) as a PNG")
    p.add_argument("--fit", action="store_true",
                   help="refit the model's free parameters by least squares and say what changed")
    p.add_argument("--write", action="store_true", help="with --fit: store the fitted values in the target file")
    p.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits")
    p.add_argument("--markdown", action="store_true", help="print the docs table (Markdown)")
    p.set_defaults(func=run)


def run(args) -> int:
    from calibration.dataset import load_dataset
    from calibration.evaluate import Programs, evaluate, holdout_summary, reserved_summary, summarize
    from calibration.fit import document_with, fit, leave_one_source_out, target_document, write_fit
    from calibration.report import markdown, plot, summary_text, text_table
    from target.hardware import TARGETS_DIR, hardware_from_dict, load_target

    if args.write and not args.fit:
        print("--write needs --fit", file=sys.stderr)
        return 2
    dataset = load_dataset(args.dataset)
    hw = load_target(args.target)
    doc = target_document(args.target)
    programs = Programs(dataset, hw)
    fitted = None
    if args.fit:
        fitted = fit(dataset, doc, programs)
        if args.write:
            write_fit(doc, fitted, dataset, programs, TARGETS_DIR / f"{args.target}.json")
        doc = document_with(doc, fitted.after)
        hw = hardware_from_dict(doc, origin="<fit>")
    results = evaluate(dataset, hw, programs)
    summary = summarize(results)
    reserved = reserved_summary(results)
    holdout = holdout_summary(results)
    loso = {} if args.no_loso else leave_one_source_out(dataset, doc, programs)
    if args.plot:
        plot(results, args.plot)
    if args.json:
        out = {"dataset": dataset.label, "target": hw.name, "hardware_digest": hw.digest,
               "points": [r.to_json() for r in results], "summary": summary, "leave_one_source_out": loso,
               "reserved": reserved, "holdout": holdout}
        if fitted is not None:
            out["fit"] = {"before": fitted.before, "after": fitted.after, "cost_before": fitted.cost_before,
                          "cost_after": fitted.cost_after, "written": bool(args.write)}
        print(json.dumps(out, indent=1))
        return 0
    if args.markdown:
        print(markdown(results, summary, loso, dataset.label, _dt.date.today().isoformat(), reserved,
                       holdout))
        return 0
    print(f"dataset {dataset.label}; target {hw.name} ({hw.digest[:12]})")
    print(text_table(results))
    print()
    print(summary_text(summary, loso, reserved, holdout))
    if fitted is not None:
        print()
        print(f"fit: sum of squared log residuals {fitted.cost_before:.4f} -> {fitted.cost_after:.4f}"
              f" ({fitted.iterations} iterations)")
        for name, before, after in fitted.changes():
            print(f"  {name}: {before:g} -> {after:g}")
        if not fitted.changes():
            print("  no parameter changed")
        print("written to the target file" if args.write else "not written (add --write to store it)")
    return 0
