"""Networks: the papers' architectures and generic wrappers around timm and torchvision."""
