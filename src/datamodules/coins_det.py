"""An embedded single-class detection set: crops of scikit-image's ``coins`` photograph.

``skimage.data.coins()`` (303x384 grey, 24 coins, shipped inside the scikit-image wheel) is the
only photograph used. Its 24 ground-truth boxes (``COIN_BOXES``) were derived once by
:func:`derive_coin_boxes`: a local threshold (``threshold_local``, block 101, offset -10; a global
Otsu threshold merges the top row of coins with the brighter background), a closing with a disk of
radius 3, holes filled, connected regions of 500 to 5,000 pixels (the coins cover 1,094 to 3,115
pixels; everything else is under 120) and their bounding boxes.

``prepare_data`` writes random crops (sides 150 to 300 pixels, horizontal and vertical flips) of
the photograph, seeded, as a VOC-layout dataset under ``root`` (``JPEGImages``, ``Annotations``,
``ImageSets/Main/{trainval,test}.txt``), read back by the VOC loader. A coin with at least 70% of
its box inside a crop is an object (``truncated`` when cut); one with 30-70% inside is marked
``difficult`` (dropped for training, ignored by the VOC metric); less is left out. Train and test
crops show the same 24 coins: the set checks that the detection pipeline learns, not how it
generalises.
"""

from __future__ import annotations

import json
import logging
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image
from scipy import ndimage

from src.datamodules.voc_det import VOCDetectionDataModule
from src.utils.extras import require

log = logging.getLogger(__name__)

# (x1, y1, x2, y2) pixel edges in the 384x303 photograph, sorted by (y1, x1)
COIN_BOXES = (
    (305, 16, 365, 72), (132, 29, 179, 74), (192, 30, 240, 73), (22, 33, 67, 74),
    (255, 34, 297, 72), (81, 39, 120, 74), (245, 95, 296, 144), (25, 104, 67, 145),
    (186, 105, 227, 145), (317, 105, 356, 145), (84, 107, 122, 145), (134, 110, 174, 145),
    (315, 156, 379, 218), (189, 170, 237, 217), (251, 172, 297, 217), (80, 175, 124, 217),
    (25, 178, 63, 217), (135, 179, 174, 217), (18, 233, 75, 288), (144, 236, 201, 288),
    (276, 239, 326, 288), (220, 240, 269, 288), (92, 245, 136, 287), (336, 248, 384, 289),
)  # fmt: skip
OBJECT_VISIBLE = 0.7  # fraction of a coin's box inside a crop that makes it an object
DIFFICULT_VISIBLE = 0.3  # ... that makes it a difficult object
STAMP = "coins_det.json"


def derive_coin_boxes() -> list[tuple[int, int, int, int]]:
    """The procedure that gave ``COIN_BOXES``: (x1, y1, x2, y2) sorted by (y1, x1)."""
    require("scikit-image", "demos", "the coins photograph")
    from skimage import data, filters, measure, morphology  # an extra: imported where used

    image = data.coins()
    foreground = image > filters.threshold_local(image, 101, offset=-10)
    foreground = ndimage.binary_fill_holes(morphology.closing(foreground, morphology.disk(3)))
    regions = measure.regionprops(measure.label(foreground))
    # regionprops' bbox is (min_row, min_col, max_row, max_col), the max exclusive
    boxes = [
        (int(r.bbox[1]), int(r.bbox[0]), int(r.bbox[3]), int(r.bbox[2]))
        for r in regions
        if 500 <= r.area <= 5000
    ]
    return sorted(boxes, key=lambda box: (box[1], box[0]))


CoinObject = tuple[tuple[int, ...], bool, bool]  # box in crop pixels, truncated, difficult


def voc_xml(name: str, width: int, height: int, objects: list[CoinObject]) -> str:
    """A PASCAL VOC annotation; boxes are pixel edges, written 1-based inclusive as VOC's are."""
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = name
    size = ET.SubElement(root, "size")
    for key, value in (("width", width), ("height", height), ("depth", 3)):
        ET.SubElement(size, key).text = str(value)
    for (x1, y1, x2, y2), truncated, difficult in objects:
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = "coin"
        ET.SubElement(obj, "truncated").text = str(int(truncated))
        ET.SubElement(obj, "difficult").text = str(int(difficult))
        box = ET.SubElement(obj, "bndbox")
        for key, value in (("xmin", x1 + 1), ("ymin", y1 + 1), ("xmax", x2), ("ymax", y2)):
            ET.SubElement(box, key).text = str(value)
    return ET.tostring(root, encoding="unicode")


def crop_objects(
    left: int, top: int, width: int, height: int, hflip: bool, vflip: bool
) -> list[CoinObject]:
    """The coins seen in a crop (after its flips); those mostly outside it are left out."""
    objects = []
    for x1, y1, x2, y2 in COIN_BOXES:
        cx1, cy1 = max(x1, left), max(y1, top)
        cx2, cy2 = min(x2, left + width), min(y2, top + height)
        if cx2 <= cx1 or cy2 <= cy1:
            continue
        visible = (cx2 - cx1) * (cy2 - cy1) / ((x2 - x1) * (y2 - y1))
        if visible < DIFFICULT_VISIBLE:
            continue
        box = [cx1 - left, cy1 - top, cx2 - left, cy2 - top]
        if hflip:
            box[0], box[2] = width - box[2], width - box[0]
        if vflip:
            box[1], box[3] = height - box[3], height - box[1]
        objects.append((tuple(box), visible < 1.0, visible < OBJECT_VISIBLE))
    return objects


class CoinsDetectionDataModule(VOCDetectionDataModule):
    """Single-class "coin" detection on generated crops of ``skimage.data.coins()``.

    Args:
        root: folder the VOC-layout set is written to (``prepare_data``) and read from.
        num_classes: 2 (background, coin).
        image_size: side S of the square network input.
        batch_size: per-device batch size.
        num_workers: data-loading worker processes.
        num_train: training crops (``ImageSets/Main/trainval.txt``).
        num_test: validation/test crops (``ImageSets/Main/test.txt``).
        crop_sides: (smallest, largest) side of a crop in pixels, at most 300 (the photograph is
            303 pixels high).
        seed: seed of the crops; the set is rewritten when it or any size changes.
        on_bad_file: "error" or "skip", as for VOC.
        check_max_seconds: time limit of the file check in ``setup``.

    Shape:
        batches are ((B, 3, S, S) float normalised, list of B target dicts), see
        :class:`src.datamodules.detection.DetectionFiles`.
    """

    def __init__(
        self,
        root: str,
        num_classes: int = 2,
        image_size: int = 300,
        batch_size: int = 8,
        num_workers: int = 2,
        *,
        num_train: int = 200,
        num_test: int = 50,
        crop_sides: tuple[int, int] = (150, 300),
        seed: int = 0,
        on_bad_file: str = "error",
        check_max_seconds: float | None = 300.0,
    ) -> None:
        super().__init__(
            root, num_classes, image_size, batch_size, num_workers,
            train_sets=((".", "trainval"),), test_set=(".", "test"), class_names=("coin",),
            on_bad_file=on_bad_file, check_max_seconds=check_max_seconds,
        )  # fmt: skip
        low, high = (int(s) for s in crop_sides)
        if not 1 <= low <= high <= 300:
            raise ValueError(
                f"crop_sides must be (low, high) with 1 <= low <= high <= 300, got {crop_sides}"
            )
        if num_train < 1 or num_test < 1:
            raise ValueError(f"num_train ({num_train}) and num_test ({num_test}) must be positive")
        self.num_train = num_train
        self.num_test = num_test
        self.crop_sides = (low, high)
        self.seed = seed

    @property
    def recipe(self) -> dict[str, object]:
        """What the written set depends on; stored beside it to tell when to rewrite it."""
        return {
            "num_train": self.num_train, "num_test": self.num_test,
            "crop_sides": list(self.crop_sides), "seed": self.seed, "boxes": len(COIN_BOXES),
        }  # fmt: skip

    def prepare_data(self) -> None:
        stamp = self.root / STAMP
        if stamp.is_file() and json.loads(stamp.read_text()) == self.recipe:
            return
        for folder in ("JPEGImages", "Annotations", "ImageSets/Main"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        require("scikit-image", "demos", "data=coins_det (the coins photograph)")
        from skimage import data  # an extra: imported where used

        photo = np.repeat(data.coins()[:, :, None], 3, axis=2)  # (303, 384, 3) uint8
        rng = np.random.default_rng(self.seed)
        low, high = self.crop_sides
        for list_name, count in (("trainval", self.num_train), ("test", self.num_test)):
            names = []
            for index in range(count):
                width, height = (int(s) for s in rng.integers(low, high + 1, size=2))
                left = int(rng.integers(0, photo.shape[1] - width + 1))
                top = int(rng.integers(0, photo.shape[0] - height + 1))
                hflip, vflip = (bool(f) for f in rng.random(2) < 0.5)
                crop = photo[top : top + height, left : left + width]
                crop = crop[:, ::-1] if hflip else crop
                crop = crop[::-1] if vflip else crop
                name = f"coins_{list_name}_{index:04d}"
                Image.fromarray(np.ascontiguousarray(crop)).save(
                    self.root / "JPEGImages" / f"{name}.jpg", quality=95
                )
                objects = crop_objects(left, top, width, height, hflip, vflip)
                (self.root / "Annotations" / f"{name}.xml").write_text(
                    voc_xml(f"{name}.jpg", width, height, objects)
                )
                names.append(name)
            split_list = self.root / "ImageSets" / "Main" / f"{list_name}.txt"
            split_list.write_text("\n".join(names) + "\n")
        stamp.write_text(json.dumps(self.recipe))
        log.info("wrote %d + %d coin crops to %s", self.num_train, self.num_test, self.root)
