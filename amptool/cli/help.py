"""``--help`` in groups (model, precision, target, inputs, tolerances, output) instead of one flat list
of 25+ options. click has no option groups: :class:`GroupedCommand` sorts each option's help
record under the heading :data:`GROUP_OF` gives its parameter name; one table for every verb."""

from __future__ import annotations

from typing import Any

import click

GROUPS = ("Model", "Precision", "Target", "Remote", "Inputs", "Tolerances", "Output", "Other")
#: Parameter name → help heading; anything unnamed goes under "Other".
GROUP_OF = {
    **dict.fromkeys(("input_shapes", "fixed_inputs", "dims", "no_prepare", "no_concretize", "max_input_bytes",
                     "artifact"), "Model"),
    **dict.fromkeys(("dtype", "colors", "exclude_ops", "exclude_nodes", "no_range_guards", "calibration",
                     "no_cancellation_guard", "margin",
                     "low_precision_io", "auto_fallback", "max_compiles", "validation", "dtypes", "target_margin"),
                    "Precision"),
    **dict.fromkeys(("target", "cuda_arch", "target_options", "lower_only", "device", "threads", "batch", "against"),
                    "Target"),
    **dict.fromkeys(("rpc_tracker", "rpc_key", "rpc_server", "rpc_timeout"), "Remote"),  # docs/remote.md
    **dict.fromkeys(("inputs_path", "inputs", "seed", "iterations", "val_ranges", "reference_outputs", "rounds",
                     "runs", "sample_axis", "fresh_workers"), "Inputs"),
    **dict.fromkeys(("atol", "rtol", "min_cosine", "check_error_stat", "max_scale_error", "tolerances_path",
                     "per_layer", "max_top1_flip", "max_top5_flip", "min_pixel_agreement"), "Tolerances"),
    **dict.fromkeys(("output_dir", "output", "output_path", "json_path", "json_summary", "emit_ir", "save_inputs",
                     "save_outputs", "plot_path", "junit_path", "show_nodes",
                     "headroom", "write_colors", "pareto_path", "pareto_plot"), "Output"),
}


class GroupedCommand(click.Command):
    """A click command whose --help lists options under :data:`GROUPS` headings."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        grouped: dict[str, list[tuple[str, str]]] = {name: [] for name in GROUPS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                grouped[GROUP_OF.get(param.name or "", "Other")].append(record)
        for name in GROUPS:
            if grouped[name]:
                with formatter.section(f"{name} options"):
                    formatter.write_dl(grouped[name])


def command(**kwargs: Any) -> Any:
    """``click.command`` with grouped help."""
    return click.command(cls=GroupedCommand, **kwargs)
