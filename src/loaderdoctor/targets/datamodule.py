"""The loaders of a LightningDataModule, taken the way Lightning's Trainer.fit takes them: prepare_data(),
setup("fit"), then train_dataloader() and val_dataloader(). Lightning itself is never imported: a DataModule is
known by its class's bases, so that users without Lightning pay nothing."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.loader.workload import Workload
from loaderdoctor.plain.usercode import describe_exception

_MODULES = ("lightning.pytorch", "pytorch_lightning")


def datamodule_base(value: Any) -> type | None:
    """Lightning's LightningDataModule class when `value` is an instance of one (of lightning.pytorch or
    pytorch_lightning), else None."""
    for cls in type(value).__mro__:
        if cls.__name__ == "LightningDataModule" and cls.__module__.startswith(_MODULES):
            return cls
    return None


def _overrides(datamodule: Any, base: type, method: str) -> bool:
    """Whether the DataModule defines `method` itself (in its class, or on the instance as from_datasets() does),
    rather than inheriting Lightning's placeholder, which raises."""
    if method in vars(datamodule):
        return True
    for cls in type(datamodule).__mro__:
        if cls is base:
            return False
        if method in vars(cls):
            return True
    return False


def _call(datamodule: Any, method: str, source: str, *args: Any) -> Any:
    try:
        return getattr(datamodule, method)(*args)
    except (Exception, SystemExit) as exc:
        shown = ", ".join(repr(a) for a in args)
        raise UsageError(
            f"{type(datamodule).__name__}.{method}({shown}) of the LightningDataModule from {source} raised "
            f"{describe_exception(exc)}",
            hint="fix the error; calling it yourself in Python shows the full traceback",
        ) from exc


def _named(returned: Any, prefix: str, method: str, source: str) -> dict[str, DataLoader]:
    """The loaders a *_dataloader() returned, by name: `prefix` for one, `prefix`_KEY or `prefix`_N for several."""
    if isinstance(returned, DataLoader):
        return {prefix: returned}
    if isinstance(returned, Mapping):
        items = [(f"{prefix}_{key}", value) for key, value in returned.items()]
    elif isinstance(returned, (list, tuple)):
        items = [(f"{prefix}_{n}", value) for n, value in enumerate(returned)]
        if len(items) == 1:
            items = [(prefix, returned[0])]
    else:
        raise UsageError(
            f"{method}() of the LightningDataModule from {source} returned {type(returned).__name__}, not a "
            "torch.utils.data.DataLoader",
            hint="loaderdoctor measures torch DataLoaders: return one (or a list or dict of them)",
        )
    for name, value in items:
        if not isinstance(value, DataLoader):
            raise UsageError(
                f"{method}() of the LightningDataModule from {source} returned {type(value).__name__} for "
                f"{name!r}, not a torch.utils.data.DataLoader",
                hint="loaderdoctor measures torch DataLoaders: return one (or a list or dict of them)",
            )
    return dict(items)


def datamodule_loaders(datamodule: Any, source: str) -> tuple[Workload, dict[str, DataLoader]]:
    """The Workload of a LightningDataModule's train loader (and first val loader) after prepare_data() and
    setup("fit"), with every loader by name: "train" and "val" (val only when val_dataloader() is defined and
    returns any). Closing the workload calls teardown("fit")."""
    base = datamodule_base(datamodule)
    assert base is not None
    if not _overrides(datamodule, base, "train_dataloader"):
        raise UsageError(
            f"the LightningDataModule {type(datamodule).__name__} from {source} defines no train_dataloader()",
            hint="define train_dataloader() to return the DataLoader that Trainer.fit trains with",
        )
    _call(datamodule, "prepare_data", source)
    _call(datamodule, "setup", source, "fit")
    try:
        loaders = _named(_call(datamodule, "train_dataloader", source), "train", "train_dataloader", source)
        if not loaders:
            raise UsageError(
                f"train_dataloader() of the LightningDataModule from {source} returned no loader",
                hint="return the DataLoader that Trainer.fit trains with",
            )
        if _overrides(datamodule, base, "val_dataloader"):
            loaders.update(_named(_call(datamodule, "val_dataloader", source), "val", "val_dataloader", source))
    except BaseException:
        _teardown(datamodule)
        raise
    train = next(iter(loaders.values()))
    val = next((loader for name, loader in loaders.items() if name.startswith("val")), None)
    workload = Workload(train=train, val=val, on_close=lambda: _teardown(datamodule))
    return workload, loaders


def _teardown(datamodule: Any) -> None:
    try:
        datamodule.teardown("fit")
    except Exception as exc:  # the measurement is done: its report is worth more than the clean-up
        warnings.warn(
            f"{type(datamodule).__name__}.teardown('fit') raised {describe_exception(exc)}",
            LoaderDoctorWarning,
            stacklevel=2,
        )
