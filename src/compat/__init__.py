"""Converters from the official implementations' state dicts to this project's modules.

One module per family (``delight``, ``pru``, ``edgenets``, ``group_transformer``); each exposes
``from_official(state_dict, config) -> nn.Module`` for the parts it covers. They only rename and
reshape tensors; the modules themselves hold no official-layout special cases.
"""
