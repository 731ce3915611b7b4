"""Export a checkpoint for devices: ``python export.py ckpt_path=/path/to.ckpt [format=onnx]
[quantize=int8] [out=/path/stem]``.

Writes ``<out>.onnx`` (dynamic batch, and image size where the network takes other sizes), its card
``<out>.json`` (model, parameters, MACs, inputs, opset, exporter, parity against eager PyTorch on
validation images, notes) and with ``quantize=int8`` ``<out>.int8.onnx`` with the validation metric
before and after. Needs the ``[export]`` extra (onnx, onnxruntime, onnxscript).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.export import export
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "export")
        export(cfg)


if __name__ == "__main__":
    main()
