"""Evaluation beyond a loss: BLEU, the VOC07 detection metric and dynamic evaluation of language
models."""
