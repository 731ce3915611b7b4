"""The model summary printed when training starts: Lightning's rich table, without FLOPs."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)

# rich's column settings of Lightning's table (RichModelSummary.summarize)
COLUMN_STYLES: dict[str, dict[str, str]] = {
    " ": {"style": "dim"},
    "Params": {"justify": "right"},
    "Params per Device": {"justify": "right"},
    "In sizes": {"justify": "right", "style": "white"},
    "Out sizes": {"justify": "right", "style": "white"},
}


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary without its FLOPs column and total.

    Lightning counts FLOPs only for a LightningModule with an ``example_input_array``; the tasks
    have none (their input shapes are the data's), so the column and "Total FLOPs" would read 0
    beside the MACs the run reports (:mod:`src.utils.complexity`, ``metrics.json``).
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(name, no_wrap=name == "Name", **COLUMN_STYLES.get(name, {}))
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        totals = Table.grid(expand=True)
        totals.add_column()
        for label, value in (
            ("Trainable params", get_human_readable_count(trainable_parameters)),
            ("Non-trainable params",
             get_human_readable_count(total_parameters - trainable_parameters)),
            ("Total params", get_human_readable_count(total_parameters)),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
        ):  # fmt: skip
            totals.add_row(f"[bold]{label}[/]: {value}")
        console = get_console()
        console.print(table)
        console.print(totals)
