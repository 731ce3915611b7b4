"""Export for devices: a network of this project as an ONNX file (run by onnxruntime, optionally
int8), checked against eager PyTorch, with a JSON card of what was exported."""
