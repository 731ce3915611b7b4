"""The images ``export.py`` checks and calibrates a vision network on, wherever they come from.

Three sources, in this order of preference:

- ``folder``: the user's images (``images=DIR``: any sizes, any format PIL reads), each resized
  and normalised as the data config's evaluation transform does (:func:`eval_transform`); they
  serve parity and int8 calibration, and, having no labels, int8 is measured by its agreement
  with the fp32 file;
- ``dataset``: the data config's splits, validation images for parity and the task metric,
  training images for calibration;
- ``generated``: random tensors of the network's input shape (the data config's
  ``example_input``), for parity only, where neither the dataset nor a folder is there; int8
  calibration refuses them (min/max ranges of noise are no ranges of images).

Every read is in batches of at most :data:`BATCH` images, whatever the data config's batch size
(256 for ImageNet), and int8 calibration runs 8 at a time (:mod:`src.export.quantize`): what the
export holds in memory is the network's activations for a few images.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2

from src.datamodules.image_conventions import image_normalisation
from src.datamodules.image_folder import DatasetLayoutError
from src.utils.errors import UsageError

BATCH = 16  # images a read holds: parity, each calibration step, each metric step
GENERATED_SEED = 0  # generated inputs are the same on every export


class NoCalibrationImagesError(UsageError):
    """int8 calibration was asked for without images to calibrate on."""


def eval_transform(datamodule: L.LightningDataModule) -> v2.Compose:
    """PIL image -> the network's input, as the data config's evaluation transform makes it.

    Class-folder data (a ``resize_size``): the short side resized to it, then the centre crop;
    other data (segmentation, detection, digits): resized to the input size, aspect not kept.
    Normalised as ``predict.py`` reads images (``image_normalisation``: digits grey with their
    statistics, the plane repeated over ``in_chans``).

    Shape:
        PIL image of any size -> (C, H, W), (C, H, W) of ``datamodule.example_input()``
    """
    channels, height, width = datamodule.example_input().shape[1:]
    resize = getattr(datamodule, "resize_size", None)
    geometry = (
        [v2.Resize(resize, antialias=True), v2.CenterCrop((height, width))]
        if resize is not None
        else [v2.Resize((height, width), antialias=True)]
    )
    mode, mean, std = image_normalisation(datamodule)
    colour = [v2.Grayscale(num_output_channels=channels)] if mode == "L" or channels == 1 else []
    if len(mean) != channels:  # a grey plane repeated over the channels (digits for RGB networks)
        mean, std = mean * channels, std * channels
    return v2.Compose(
        [
            v2.ToImage(),
            *colour,
            *geometry,
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )


def image_files(folder: str | Path) -> list[Path]:
    """The image files directly in ``folder`` (by suffix, as torchvision's ``ImageFolder``),
    sorted; a one-line error when it is not a folder or holds none."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"images={folder} is not a folder; pass images=<a folder of images>")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
    if not files:
        raise UsageError(
            f"images={folder} holds no image files ({', '.join(IMG_EXTENSIONS)}); "
            "pass a folder of images"
        )
    return files


def read_folder_image(path: Path, transform: Callable[[Any], Tensor]) -> Tensor:
    """One image file through ``transform``, or a one-line error naming the file."""
    try:
        with Image.open(path) as file:
            image = file.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:  # UnidentifiedImageError is an OSError
        raise UsageError(
            f"{path} cannot be read as an image ({error}); remove it from the images= folder"
        ) from None
    return transform(image)


def batched(images: Iterable[Tensor], size: int) -> Iterator[Tensor]:
    """Batches of at most ``size`` images out of ``images``, each (B, C, H, W) or (C, H, W)."""
    pending: list[Tensor] = []
    for item in images:
        pending.extend(item if item.dim() == 4 else [item])
        while len(pending) >= size:
            yield torch.stack(pending[:size])
            pending = pending[size:]
    if pending:
        yield torch.stack(pending)


def limited(batches: Iterable[Tensor], limit: int) -> Iterator[Tensor]:
    """The first ``limit`` images of ``batches`` (each (B, C, H, W)), in the same batches."""
    left = limit
    for images in batches:
        if left <= 0:
            return
        yield images[:left]
        left -= len(images[:left])


def images_of(batch: Any) -> Tensor:
    """The images of a data batch: ``(images, targets)`` or images alone."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


@dataclass
class ExportImages:
    """Where the images come from and how to read them.

    Attributes:
        source: ``"folder"``, ``"dataset"`` or ``"generated"`` (module docstring).
        description: what the parity images are, for the card and the summary.
        check: the parity images, (N, C, H, W) with N <= :data:`BATCH`.
        calibration: a fresh iterator of image batches (B, C, H, W), B <= :data:`BATCH`, or None
            where there is nothing to calibrate on.
        calibration_source: what the calibration images are (None without them).
        labelled: a fresh iterable of (images, targets) batches of the validation split, or None
            where the images have no labels.
    """

    source: str
    description: str
    check: Tensor
    calibration: Callable[[], Iterator[Tensor]] | None
    calibration_source: str | None
    labelled: Callable[[], Iterable[Any]] | None


def folder_images(datamodule: L.LightningDataModule, folder: str | Path) -> ExportImages:
    """The images of ``images=folder`` (module docstring), read when a batch is asked for."""
    files = image_files(folder)
    transform = eval_transform(datamodule)

    def read(paths: list[Path]) -> Iterator[Tensor]:
        return batched((read_folder_image(path, transform) for path in paths), BATCH)

    check = next(read(files[:BATCH]))
    return ExportImages(
        source="folder",
        description=f"{len(check)} images of {folder}",
        check=check,
        calibration=lambda: read(files),
        calibration_source=f"images of {folder}",
        labelled=None,
    )


def training_images(datamodule: L.LightningDataModule) -> Iterator[Tensor]:
    """Every image of the training split, in batches, shuffled as its loader shuffles. A training
    loader drops its last partial batch: one over a split smaller than a batch would give none."""
    loader = datamodule.train_dataloader()
    if isinstance(loader, DataLoader) and loader.drop_last:
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            shuffle=True,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
        )
    return (images_of(batch) for batch in loader)


def dataset_images(datamodule: L.LightningDataModule) -> ExportImages:
    """The data config's splits (after ``setup("fit")``), read :data:`BATCH` images at a time."""
    # the loaders read the datamodule's batch_size when they are built, as Lightning's batch-size
    # finder relies on; all vision datamodules here keep it in that attribute
    datamodule.batch_size = BATCH
    loaders = datamodule.val_dataloader()
    val = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    check = images_of(next(iter(val)))
    return ExportImages(
        source="dataset",
        description=f"{len(check)} images of the validation split",
        check=check,
        calibration=lambda: training_images(datamodule),
        calibration_source="images of the training split",
        labelled=lambda: val,
    )


def generated_images(datamodule: L.LightningDataModule) -> ExportImages:
    """:data:`BATCH` standard-normal tensors of the network's input shape (fixed seed)."""
    shape = tuple(datamodule.example_input(BATCH).shape)
    generator = torch.Generator().manual_seed(GENERATED_SEED)
    return ExportImages(
        source="generated",
        description=(
            f"{BATCH} generated inputs (standard-normal tensors of shape {list(shape[1:])})"
        ),
        check=torch.randn(shape, generator=generator),
        calibration=None,
        calibration_source=None,
        labelled=None,
    )


def export_images(
    datamodule: L.LightningDataModule, folder: str | Path | None
) -> tuple[ExportImages, str | None]:
    """The images of ``folder`` when given, else the dataset's, else generated ones; with the
    reason the dataset could not be read (its error's first line) when generated ones are used."""
    if folder is not None:
        return folder_images(datamodule, folder), None
    try:
        datamodule.prepare_data()
        datamodule.setup("fit")
    except DatasetLayoutError as error:
        return generated_images(datamodule), str(error).splitlines()[0]
    return dataset_images(datamodule), None
