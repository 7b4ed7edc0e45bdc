"""Plan, launch, train and record SFT runs; no UI code (the TUI lives in `tui`)."""

__version__ = "0.1.0"


def _quiet_torchao() -> None:
    # transformers imports torchao whenever it is installed (a dependency, for method.kind=qlora); at import torchao
    # logs a warning for each CUDA kernel library it cannot load (all of them on a CPU machine) and registers enums
    # with torch's pytree, which logs a deprecation for each. Neither is about the run.
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


_quiet_torchao()
