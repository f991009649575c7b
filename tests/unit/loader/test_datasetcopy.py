"""own_copy() and the probe's use of it: loading in this process leaves the user's dataset as it was (fast, no
workers), so that workers forked afterwards start as a training loop's would."""

from __future__ import annotations

from torch.utils.data import ConcatDataset, DataLoader, Subset

from loaderdoctor.loader.datasetcopy import own_copy
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measure import probe
from shared_datasets import OpensLazily


class RefusesCopying(OpensLazily):
    def __reduce_ex__(self, protocol: object) -> object:
        raise TypeError("cannot copy this dataset")


def test_a_handle_opened_on_the_copy_stays_off_the_original_and_the_data_is_shared():
    dataset = OpensLazily()
    copied = own_copy(dataset)
    copied[0]
    assert copied.handle == "open" and dataset.handle is None
    assert copied.data is dataset.data  # a shallow copy: the data is not duplicated


def test_datasets_held_by_a_dataset_are_copied_too():
    inner, first, second = OpensLazily(), OpensLazily(), OpensLazily()
    subset = own_copy(Subset(inner, [1, 2, 3]))
    concat = own_copy(ConcatDataset([first, second]))
    subset[0], concat[0], concat[20]
    assert subset.dataset.handle == "open" and inner.handle is None
    assert [d.handle for d in concat.datasets] == ["open", "open"] and first.handle is second.handle is None


def test_a_dataset_that_cannot_be_copied_is_loaded_as_it_is():
    dataset = RefusesCopying()
    assert own_copy(dataset) is dataset


def test_a_probe_loading_in_this_process_leaves_the_users_dataset_unopened():
    """num_workers=0 measured in this process (check's search and verify do so beside the user's settings) must
    not open the user's file: every worker forked afterwards would inherit it open, and skip the start-up that
    the workers of the user's own loop pay each epoch."""
    dataset = OpensLazily()
    spec = LoaderSpec.from_loader(DataLoader(dataset, batch_size=4))
    rec = probe(spec, Settings(num_workers=0), budget_s=0.2, epochs=2)
    assert len(rec.batches) >= 4
    assert dataset.handle is None and dataset.opened == 0
