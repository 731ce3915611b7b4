"""The :class:`~src.export.spec.ExportSpec` of a vision network: classifiers with a dynamic batch
and image size, the segmentation networks and SSD with a dynamic batch.

An image side is dynamic in steps of the network's output stride (the ratio of the input side to
its last feature map's): DiCE's dimension-wise convolutions resize each input to the size they
were built for and back, and that resize is in the graph. SSD's priors are laid out for one image
size, so its side is fixed; the graph ends at the boxes' encoded offsets and the class logits,
before softmax, decoding and NMS, which are left to the caller.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from src.export.spec import ExportSpec
from src.models.ssd import SSD

BATCH = "batch"


def output_stride(net: nn.Module, image: Tensor) -> int:
    """The input side over the last feature map's side, from one forward of ``forward_features``
    (the network's, or its backbone's for a segmentation network)."""
    owner = net if hasattr(net, "forward_features") else getattr(net, "backbone", None)
    if owner is None or not hasattr(owner, "forward_features"):
        raise TypeError(f"{type(net).__name__} exposes no forward_features to find its stride")
    with torch.no_grad():
        last = owner.forward_features(image)[-1]  # (B, C, H / stride, W / stride)
    return max(image.shape[-2] // last.shape[-2], 1)


def ops_on_reference_paths(net: nn.Module) -> list[str]:
    """Names of the :mod:`src.ops` modules in ``net``: each took its PyTorch reference path."""
    return sorted(
        {type(m).__name__ for m in net.modules() if type(m).__module__.startswith("src.ops.")}
    )


def vision_spec(net: nn.Module, image: Tensor, fixed_size: bool = False) -> ExportSpec:
    """The spec of ``net`` traced on ``image`` (B, C, H, W), in eval mode; ``fixed_size``: the
    graph takes ``image``'s height and width only (batch dynamic), as a device with one camera
    size runs it. A classifier's size is dynamic otherwise. At one size, DiCE units at their build
    size have no resize products in the graph
    (:func:`src.kernels.dim_conv.dim_conv_exported`): DiCENet s=1.0 at 224x224 ran in 10.36 ms in
    onnxruntime against 12.58 ms with a dynamic size (2 threads, docs/deploy.md).

    Shape:
        image (B, C, H, W) -> classifier logits (B, K); segmentation logits (B, K, H, W);
        SSD locations (B, P, 4) and scores (B, P, K)
    """
    net.eval()
    reference = ops_on_reference_paths(net)
    notes = [
        "every op took its PyTorch reference path (src.kernels.dispatch.exporting): no fused C++ "
        "or Triton kernel, measured path choice or folded inference path is in the graph"
        + (f"; ops: {', '.join(reference)}" if reference else ""),
        (
            "BatchNorm exported in eval form (running statistics); onnxruntime folds it into the "
            "preceding convolution when it loads the graph"
        ),
    ]
    if isinstance(net, SSD):
        notes.append(
            "outputs are the priors' encoded offsets (centre variance 0.1, size variance 0.2) and "
            "class logits before softmax; decoding and NMS are left to the caller; the image "
            f"side is fixed at {net.image_size} (the priors are laid out for it)"
        )
        return ExportSpec(
            name="network",
            module=net,
            inputs=(image,),
            input_names=["image"],
            output_names=["locations", "scores"],
            dynamic={"image": {0: BATCH}},
            notes=notes,
        )
    stride = output_stride(net, image)
    with torch.no_grad():
        out = net(image)
    if out.dim() == 4:
        # the EPP decoder's resizes bake index tables of the traced size into the graph
        # (onnxruntime then fails at another size): a segmentation graph runs its export size
        notes.append(
            f"image size fixed at {tuple(image.shape[2:])}; batch dynamic; logits per pixel"
        )
    elif fixed_size:
        notes.append(f"image size fixed at {tuple(image.shape[2:])} (fixed_size); batch dynamic")
    elif min(image.shape[-2:]) < 2 * stride:
        # a dynamic side is traced as steps * stride with steps >= 2 (some units refuse a 1x1
        # last map): an image under two output strides is exported at its own size
        notes.append(
            f"image size fixed at {tuple(image.shape[2:])}, under two output strides "
            f"({2 * stride}); batch dynamic"
        )
    if out.dim() == 4 or fixed_size or min(image.shape[-2:]) < 2 * stride:
        return ExportSpec(
            name="network",
            module=net,
            inputs=(image,),
            input_names=["image"],
            output_names=["logits"],
            dynamic={"image": {0: BATCH}},
            notes=notes,
        )
    notes.append(
        f"image height and width are dynamic in multiples of the output stride {stride}"
        + (" (DiCE's resize to its build size is in the graph)" if "DimConv" in reference else "")
    )
    return ExportSpec(
        name="network",
        module=net,
        inputs=(image,),
        input_names=["image"],
        output_names=["logits"],
        dynamic={"image": {0: BATCH, 2: "height", 3: "width"}},
        steps={"height": stride, "width": stride},
        notes=notes,
    )


def other_sizes(spec: ExportSpec) -> list[tuple[int, int]]:
    """Two image sizes besides the export size that the graph must take (none when the side is
    fixed): one taller and wider, one smaller where two steps allow it, both non-square."""
    if "height" not in spec.steps:
        return []
    height, width = spec.inputs[0].shape[-2:]
    step = spec.steps["height"]
    smaller = (
        (height - step, width + step) if height - step >= 2 * step else (height + 3 * step, width)
    )
    return [(height + step, width + 2 * step), smaller]
