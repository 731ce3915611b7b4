"""The ops' custom-op contracts: ``<op>.py`` defines, once, the schema of each custom op of
:mod:`src.ops.<op>` and its fake function (its outputs' metadata while ``torch.compile`` or
``torch.export`` traces), the operand rules that the op's paths share, and for a differentiable
op the ``setup_context`` that its back-ends' backward rules read.

A contract is what a reference and its kernels agree on. The op's module (the reference, the
dispatch and the wrappers of the C++ kernels) and its Triton kernels
(:mod:`src.kernels.triton.<op>`) import it and register their implementations under it: with
:func:`src.kernels.custom_ops.autograd_op` a differentiable forward (its backward kernel as the
autograd rule), with :func:`src.kernels.dispatch.opaque_op` a kernel that an autograd rule or an
autograd Function calls. A contract imports no op module and no back-end.
"""
