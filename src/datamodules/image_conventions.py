"""How a vision datamodule's images are read and its classes named: what ``predict.py`` does with
an image and prints, and what ``export.py`` writes into an exported file for applications that
run it without this project.

Images (:func:`image_normalisation`): digits are read as grey (PIL mode ``L``), normalised with
their mean and std and the plane repeated over ``in_chans``; the others as RGB with the
datamodule's ``mean``/``std`` (ImageNet's when it has none).

Class names, in label order: digits ``"0"`` ... ``"9"``; class folders (ImageNet and the like):
the folder names, once set up; detection: the datamodule's ``class_names`` (``background``
first); segmentation: VOC's 21 or Cityscapes' 19 train ids (20 with EdgeNets' background) by the
number of classes; otherwise ``class i``.
"""

from __future__ import annotations

import lightning as L

from src.datamodules.digits import DIGITS_MEAN, DIGITS_STD, DigitsDataModule
from src.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataModule
from src.datamodules.voc_seg import VOC_CLASSES

# the 19 Cityscapes train ids (road 0 ... bicycle 18); EdgeNets' weights add background as 19
CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
    "bicycle",
)  # fmt: skip
# segmentation class names by number of classes
SEGMENTATION_CLASSES: dict[int, tuple[str, ...]] = {
    len(VOC_CLASSES): VOC_CLASSES,
    len(CITYSCAPES_CLASSES): CITYSCAPES_CLASSES,
    len(CITYSCAPES_CLASSES) + 1: (*CITYSCAPES_CLASSES, "background"),
}


def image_normalisation(
    datamodule: L.LightningDataModule,
) -> tuple[str, tuple[float, ...], tuple[float, ...]]:
    """``(PIL mode, mean, std)`` an image is read and normalised with (after scaling to [0, 1]):
    one value per plane of the mode (``L``: 1, ``RGB``: 3)."""
    if isinstance(datamodule, DigitsDataModule):
        return "L", (DIGITS_MEAN,), (DIGITS_STD,)
    mean = getattr(datamodule, "mean", IMAGENET_MEAN)
    std = getattr(datamodule, "std", IMAGENET_STD)
    return "RGB", tuple(mean), tuple(std)


def numbered(num_classes: int) -> tuple[str, ...]:
    """``class 0``, ``class 1``, ...: names for classes nothing names."""
    return tuple(f"class {i}" for i in range(num_classes))


def segmentation_names(num_classes: int) -> tuple[str, ...]:
    """VOC (21) or Cityscapes (19, or 20 with background) names, else ``class i``."""
    return SEGMENTATION_CLASSES.get(num_classes, numbered(num_classes))


def classification_names(datamodule: L.LightningDataModule, num_classes: int) -> tuple[str, ...]:
    """The digit for the digits data, the class folders' names for a set-up class-folder
    datamodule of ``num_classes`` folders; class indices otherwise."""
    if isinstance(datamodule, DigitsDataModule):
        return tuple(str(i) for i in range(num_classes))
    if isinstance(datamodule, ImageFolderDataModule) and datamodule.splits:
        folders = tuple(next(iter(datamodule.splits.values())).classes)
        if len(folders) == num_classes:
            return folders
    return numbered(num_classes)


def detection_names(datamodule: L.LightningDataModule, num_classes: int) -> tuple[str, ...]:
    """A detection datamodule's ``class_names`` (label 0 is the background), else ``class i``."""
    return tuple(getattr(datamodule, "class_names", numbered(num_classes)))
