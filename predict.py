"""Predict on one image: ``python predict.py image=/path/to.jpg ckpt_path=... [overrides]``.

With ``ckpt_path`` (a checkpoint of this project) the network is rebuilt from the checkpoint's run
record (command-line overrides still win); without it, from the command line's config with the
weights of ``task.init_checkpoint=`` (a checkpoint of ours or an official release file) or
``model.weights=`` (timm/torchvision). A network without weights is refused unless ``allow_random=true``.
The image is read as the EdgeNets scripts read it (PIL, bilinear resize to (W, H), ``to_tensor``,
per-channel normalisation). A network output of shape:

- (1, C, H, W) (segmentation): the per-pixel argmax is drawn over the image in class colours
  (``alpha`` opacity, at the image's own size) with a legend of the classes present underneath,
  and written as a PNG (``output``, default ``<run dir>/<image stem>_overlay.png``);
- (1, C) (classification): the ``top_k`` classes and their softmax probabilities are written to
  stdout as a table and logged;
- a pair (1, P, 4), (1, P, C) (SSD detection): the detections (softmax, decoding, NMS as in
  evaluation) scoring at least ``score_threshold`` are drawn on the image as boxes tagged with the
  class name and score, and written as a PNG (``output``, default
  ``<run dir>/<image stem>_detections.png``); the best ``SHOWN_DETECTIONS`` are logged with their
  boxes (x1, y1, x2, y2) in pixels of the image, clipped to it, as every drawn and returned box.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.predict import predict
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="predict")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "predict")
        predict(cfg)


if __name__ == "__main__":
    main()
