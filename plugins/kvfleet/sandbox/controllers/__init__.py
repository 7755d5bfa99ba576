"""Simulated controllers of the sandbox. Each module exposes ``attach(twin: ClusterTwin) -> Controller`` and
is attached, in the order of ``CONTROLLER_MODULES``, to every cluster twin by ``kvfleet.sandbox.runtime``."""

CONTROLLER_MODULES = ("workloads", "operator", "kyverno", "curvine", "vllm")
