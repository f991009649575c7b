"""resolve(TARGET): every form it accepts, and a clear UsageError (what, where, what to do) for every bad one."""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from loaderdoctor import scenarios
from loaderdoctor.errors import UsageError
from loaderdoctor.loader.workload import Workload
from loaderdoctor.plain.usercode import describe_exception
from loaderdoctor.targets.resolve import ResolvedTarget, resolve

LOADERS = """
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset


class Squares(Dataset):
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i * i])


def make_loader():
    return DataLoader(Squares(), batch_size=4)


def make_loaders():
    return {"train": DataLoader(Squares(), batch_size=4), "val": DataLoader(Squares(3), batch_size=2)}
"""


@pytest.fixture(autouse=True)
def restore_import_state(tmp_path):
    """Put back sys.path and forget every module imported from tmp_path, so tests do not see each other's."""
    saved_path = list(sys.path)
    yield
    sys.path[:] = saved_path
    root = str(tmp_path.resolve())
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None) or ""
        if os.path.realpath(filename).startswith(root + os.sep):
            del sys.modules[name]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory, the current directory during the test, with a helper that writes files into it."""
    monkeypatch.chdir(tmp_path)

    def write(relative: str, source: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"))
        return path

    return write


def usage_error(target: str) -> UsageError:
    """The UsageError that resolve(target) raises (exit status 2, with a hint)."""
    with pytest.raises(UsageError) as caught:
        resolve(target)
    error = caught.value
    assert error.exit_status == 2
    assert error.hint
    return error


# --- the forms that work --------------------------------------------------------------------------------------


def test_file_returning_a_loader_is_checked_as_loader(project):
    project("loaders_a.py", LOADERS)
    with resolve("loaders_a.py:make_loader") as resolved:
        assert isinstance(resolved, ResolvedTarget)
        assert list(resolved.loaders) == ["loader"]
        assert isinstance(resolved.loaders["loader"], DataLoader)
        assert resolved.workload.train is resolved.loaders["loader"]
        assert resolved.target == "loaders_a.py:make_loader"


def test_file_returning_a_dict_checks_every_loader(project):
    project("loaders_b.py", LOADERS)
    resolved = resolve("loaders_b.py:make_loaders")
    assert list(resolved.loaders) == ["train", "val"]
    assert resolved.workload.train is resolved.loaders["train"]
    assert resolved.workload.val is resolved.loaders["val"]
    resolved.close()


def test_dict_with_other_names_keeps_them_all(project):
    project(
        "loaders_c.py",
        LOADERS
        + """
def many():
    return {"images": DataLoader(Squares(), batch_size=2), "text": DataLoader(Squares(), batch_size=5)}
""",
    )
    resolved = resolve("loaders_c.py:many")
    assert list(resolved.loaders) == ["images", "text"]
    assert resolved.workload.train is resolved.loaders["images"]
    assert resolved.workload.val is None


def test_workload_is_taken_as_it_is_and_closed_once(project):
    project(
        "loaders_d.py",
        LOADERS
        + """
from loaderdoctor.loader.workload import Workload

CLOSED = []


def job():
    return Workload(
        train=DataLoader(Squares(), batch_size=4),
        val=DataLoader(Squares(), batch_size=4),
        step_ms=5.0,
        on_close=lambda: CLOSED.append(True),
    )
""",
    )
    resolved = resolve("loaders_d.py:job")
    assert isinstance(resolved.workload, Workload)
    assert resolved.workload.step_ms == 5.0
    assert list(resolved.loaders) == ["train", "val"]
    resolved.close()
    resolved.close()
    assert sys.modules["loaders_d"].CLOSED == [True]


def test_module_form_finds_a_package_in_the_current_directory(project, monkeypatch):
    project("mypkg_e/__init__.py", "")
    project("mypkg_e/data.py", LOADERS)
    cwd = os.getcwd()
    # a console script does not put the current directory on sys.path: resolve must
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and os.path.abspath(p) != cwd])
    resolved = resolve("mypkg_e.data:make_loaders")
    assert list(resolved.loaders) == ["train", "val"]
    assert sys.path[0] == cwd


def test_file_in_a_subdirectory_is_imported_by_its_name_so_workers_can_unpickle_its_classes(project):
    path = project("scripts/loaders_f.py", LOADERS)
    resolved = resolve("scripts/loaders_f.py:make_loader")
    dataset = resolved.loaders["loader"].dataset
    assert type(dataset).__module__ == "loaders_f"
    assert Path(sys.modules["loaders_f"].__file__) == path.resolve()
    assert sys.path[0] == str(path.parent.resolve())
    # pickled by reference: the class must be importable under the name it records
    assert b"loaders_f" in pickle.dumps(dataset)
    assert type(pickle.loads(pickle.dumps(dataset))) is type(dataset)


def test_resolving_a_file_twice_imports_it_once(project):
    project("loaders_g.py", LOADERS + "\nIMPORTS = []\nIMPORTS.append(1)\n")
    resolve("loaders_g.py:make_loader")
    resolve("loaders_g.py:make_loader")
    assert sys.modules["loaders_g"].IMPORTS == [1]


def test_function_with_default_arguments_is_fine(project):
    project("loaders_h.py", LOADERS + "\ndef with_defaults(batch_size=2, *args, **kwargs):\n    return make_loader()\n")
    assert list(resolve("loaders_h.py:with_defaults").loaders) == ["loader"]


def test_iterable_dataset_loader_is_valid(project):
    project(
        "loaders_i.py",
        LOADERS
        + """
class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(0))


def stream():
    return DataLoader(Stream(), batch_size=4, drop_last=True)
""",
    )
    assert list(resolve("loaders_i.py:stream").loaders) == ["loader"]


# --- bad target strings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "hint_part"),
    [
        ("", "scenario:NAME"),
        ("mypkg.data", "scenario:NAME"),
        ("train.py", "train.py:FUNCTION"),
        (":make", "before the colon"),
        ("mypkg.data:", "mypkg.data:FUNCTION"),
        ("train.py:  ", "train.py:FUNCTION"),
    ],
)
def test_target_without_module_or_function_is_refused(project, target, hint_part):
    error = usage_error(target)
    assert "expected MODULE:FUNCTION or path/to/file.py:FUNCTION" in error.message
    assert hint_part in error.hint


def test_bare_scenario_name_points_at_scenario_form(project):
    error = usage_error("healthy")
    assert "scenario:healthy" in error.hint


def test_function_with_parentheses_is_not_a_function_name(project):
    error = usage_error("train.py:make()")
    assert "'make()' is not a function name" in error.message
    assert "without parentheses" in error.hint


def test_relative_module_name_is_refused(project):
    error = usage_error(".data:make")
    assert "not a module name" in error.message


def test_unknown_scenario_lists_the_scenarios():
    error = usage_error("scenario:no-such-scenario")
    assert "no-such-scenario" in error.message
    for name in scenarios.names():
        assert name in error.hint


# --- modules and files that cannot be imported ----------------------------------------------------------------


def test_unknown_module_names_the_current_directory_and_pythonpath(project, tmp_path):
    error = usage_error("nosuchmodule_xyz.data:make")
    assert "no module named 'nosuchmodule_xyz.data'" in error.message
    assert "there is no module 'nosuchmodule_xyz'" in error.message
    assert str(tmp_path) in error.message
    assert "PYTHONPATH" in error.message
    assert "nosuchmodule_xyz" in error.hint and "PYTHONPATH" in error.hint


def test_missing_submodule_of_an_existing_package(project):
    project("mypkg_j/__init__.py", "")
    error = usage_error("mypkg_j.nothere:make")
    assert "no module named 'mypkg_j.nothere'" in error.message
    assert "there is no module" not in error.message


def test_missing_dependency_is_named_with_the_line_that_imports_it(project):
    project("mypkg_k/__init__.py", "")
    project("mypkg_k/data.py", "import os\nimport not_installed_dep_xyz.sub\n")
    error = usage_error("mypkg_k.data:make")
    assert "it needs the module 'not_installed_dep_xyz'" in error.message
    assert "not installed" in error.message
    assert os.path.join("mypkg_k", "data.py") + ":2" in error.message
    assert "'not_installed_dep_xyz'" in error.hint
    assert isinstance(error.__cause__, ModuleNotFoundError)


def test_missing_dependency_of_a_file(project):
    project("loaders_l.py", "import os\n\nfrom not_installed_dep_xyz import thing\n")
    error = usage_error("loaders_l.py:make")
    assert "not_installed_dep_xyz" in error.message
    assert "loaders_l.py:3" in error.message


def test_import_error_for_a_name_the_dependency_lacks(project):
    project("loaders_m.py", "from os import no_such_name_xyz\n")
    error = usage_error("loaders_m.py:make")
    assert "cannot import name 'no_such_name_xyz'" in error.message
    assert "loaders_m.py:1" in error.message


def test_relative_import_in_a_file_suggests_the_module_form(project):
    project("mypkg_n/__init__.py", "")
    project("mypkg_n/data.py", "from . import helpers\n")
    error = usage_error("mypkg_n/data.py:make")
    assert "relative import" in error.message
    assert "pkg.module:FUNCTION" in error.hint


def test_file_that_does_not_exist(project):
    error = usage_error("scripts/nothere.py:make")
    assert "no file 'scripts/nothere.py'" in error.message
    assert os.getcwd() in error.message


def test_directory_is_not_a_file(project):
    project("adir/x.txt", "")
    error = usage_error("adir/:make")
    assert "is a directory" in error.message


def test_file_that_is_not_python(project):
    project("notes/loaders.txt", "")
    error = usage_error("notes/loaders.txt:make")
    assert "is not a .py file" in error.message


def test_dotted_file_name_must_be_renamed(project):
    project("my.loaders.py", LOADERS)
    error = usage_error("my.loaders.py:make_loader")
    assert "rename" in error.hint and "my_loaders.py" in error.hint


@pytest.mark.parametrize("stem", ["json", "torch", "tabnanny"])
def test_file_named_like_another_module_must_be_renamed(project, stem):
    # json and torch are imported already; tabnanny is not, but the standard library has it
    project(f"sub/{stem}.py", LOADERS)
    error = usage_error(f"sub/{stem}.py:make_loader")
    assert f"as the module '{stem}'" in error.message
    assert "taken by" in error.message
    assert "rename the file" in error.hint
    assert importlib.util.find_spec(stem).origin != str(Path(f"sub/{stem}.py").resolve())


def test_syntax_error_gives_file_and_line(project):
    project("loaders_o.py", "x = 1\n\ndef make(:\n    pass\n")
    error = usage_error("loaders_o.py:make")
    assert "syntax error in loaders_o.py:3" in error.message
    assert "py_compile loaders_o.py" in error.hint


def test_module_raising_at_import_names_the_error_and_line(project):
    project("loaders_p.py", "import os\nSETTING = int(os.environ.get('NOPE_XYZ', 'abc'))\n")
    error = usage_error("loaders_p.py:make")
    assert "importing loaders_p.py raised ValueError: invalid literal for int()" in error.message
    assert "loaders_p.py:2 in <module>" in error.message
    assert "top-level code" in error.hint


def test_script_exiting_at_import(project):
    project("loaders_q.py", "import sys\n\nsys.exit(3)\n")
    error = usage_error("loaders_q.py:make")
    assert "called sys.exit(3)" in error.message
    assert "loaders_q.py:3" in error.message
    assert '__name__ == "__main__"' in error.hint


# --- the function ---------------------------------------------------------------------------------------------


def test_missing_function_lists_close_matches_first(project):
    project("loaders_r.py", LOADERS + "\ndef aaa_helper():\n    pass\n")
    error = usage_error("loaders_r.py:make_loadres")
    assert "loaders_r.py has no function 'make_loadres'" in error.message
    assert error.hint.startswith("did you mean 'make_loaders'?")
    listed = error.hint.split("functions defined there: ")[1].split(", ")
    assert listed[:2] == ["make_loaders", "make_loader"]
    assert "aaa_helper" in listed and "Squares" in listed
    assert "DataLoader" not in listed  # imported, not defined there


def test_missing_function_in_a_module_names_its_file(project):
    project("mypkg_s/__init__.py", "")
    project("mypkg_s/data.py", "def build():\n    pass\n")
    error = usage_error("mypkg_s.data:make")
    assert "module 'mypkg_s.data' (" + os.path.join("mypkg_s", "data.py") + ") has no function 'make'" in (
        error.message
    )
    assert "build" in error.hint


def test_missing_function_in_a_module_without_functions(project):
    project("loaders_t.py", "X = 1\n")
    error = usage_error("loaders_t.py:make")
    assert "defines no public functions" in error.hint


def test_attribute_that_is_not_callable(project):
    project("loaders_u.py", LOADERS + "\nloader = make_loader()\n")
    error = usage_error("loaders_u.py:loader")
    assert "loaders_u.py:loader is an object of type torch.utils.data.dataloader.DataLoader" in error.message
    assert "not a function" in error.message
    assert "def make_loaders(): return loader" in error.hint


def test_function_that_requires_arguments(project):
    project("loaders_v.py", "import os\n\ndef make(root, batch_size=4, *, shuffle):\n    pass\n")
    error = usage_error("loaders_v.py:make")
    assert "make() must take no arguments, but it requires root, shuffle" in error.message
    assert "loaders_v.py:3" in error.message
    assert "defaults" in error.hint


def test_function_that_raises_names_the_error_and_the_users_line(project):
    project(
        "loaders_w.py",
        """
        def _read(path):
            raise FileNotFoundError(f"no data at {path}")


        def make():
            return _read("/data/train")
        """,
    )
    error = usage_error("loaders_w.py:make")
    assert "make() in loaders_w.py raised FileNotFoundError: no data at /data/train" in error.message
    assert "(at loaders_w.py:2 in _read)" in error.message
    assert "loaderdoctor" not in error.message.split("(at ")[1]
    assert isinstance(error.__cause__, FileNotFoundError)


def test_error_raised_inside_torch_points_at_the_users_call(project):
    project(
        "loaders_x.py",
        """
        from torch.utils.data import DataLoader


        def make():
            return DataLoader(list(range(8)), batch_size=0)
        """,
    )
    error = usage_error("loaders_x.py:make")
    assert "raised ValueError: batch_size should be a positive integer" in error.message
    assert "(at loaders_x.py:5 in make)" in error.message


def test_function_that_exits_hints_at_argparse(project):
    project("loaders_y.py", "import argparse\n\ndef make():\n    argparse.ArgumentParser().parse_args(['--x'])\n")
    error = usage_error("loaders_y.py:make")
    assert "raised SystemExit: 2 (at loaders_y.py:4 in make)" in error.message
    assert "argparse" in error.hint


# --- what the function returns --------------------------------------------------------------------------------

RETURNS = (
    LOADERS
    + """

def nothing():
    pass


def pair():
    return make_loader(), make_loader()


def dataset():
    return Squares()


def number():
    return 3


def empty_dict():
    return {}


def int_key():
    return {0: make_loader()}


def bad_value():
    return {"train": make_loader(), "val": [1, 2]}


def short_val():
    return {"train": make_loader(), "val": DataLoader(Squares(3), batch_size=8, drop_last=True)}


def empty_dataset():
    return DataLoader(Squares(0), batch_size=8)


def empty_sampler():
    return DataLoader(Squares(5), batch_size=2, sampler=[])


def empty_workload():
    return Workload(
        train=make_loader(),
        val=DataLoader(Squares(3), batch_size=8, drop_last=True),
        on_close=lambda: CLOSED.append(True),
    )


from loaderdoctor.loader.workload import Workload

CLOSED = []
"""
)


@pytest.mark.parametrize(
    ("fn", "returned", "hint_part"),
    [
        ("nothing", "returned None", "return loader"),
        ("pair", "returned a tuple of 2 DataLoaders", '{"train": train_loader, "val": val_loader}'),
        ("dataset", "returned a dataset (returns_z.Squares)", "DataLoader(dataset, batch_size=...)"),
        ("number", "returned an object of type int", "DataLoader"),
    ],
)
def test_wrong_return_type_says_what_came_back_and_what_is_accepted(project, fn, returned, hint_part):
    project("returns_z.py", RETURNS)
    error = usage_error(f"returns_z.py:{fn}")
    assert f"{fn}() in returns_z.py {returned}" in error.message
    accepted = "a DataLoader, a dict of name -> DataLoader, a loaderdoctor.Workload, or a LightningDataModule"
    assert accepted in error.message.replace("torch.utils.data.", "")
    assert hint_part in error.hint


@pytest.mark.parametrize(
    ("fn", "message_part"),
    [
        ("empty_dict", "returned an empty dict"),
        ("int_key", "returned a dict with the key 0"),
        ("bad_value", "value for 'val' is a list of 2 items, not a torch.utils.data.DataLoader"),
    ],
)
def test_bad_dict_names_the_problem(project, fn, message_part):
    project("returns_z.py", RETURNS)
    error = usage_error(f"returns_z.py:{fn}")
    assert message_part in error.message


def test_loader_without_batches_because_of_drop_last(project):
    project("returns_z.py", RETURNS)
    error = usage_error("returns_z.py:short_val")
    assert (
        "the loader 'val' from short_val() in returns_z.py has no batches "
        "(dataset of 3 samples, batch_size 8, drop_last=True)"
    ) in error.message
    assert "drop_last=False" in error.hint and "at most 3" in error.hint


def test_loader_without_batches_because_the_dataset_is_empty(project):
    project("returns_z.py", RETURNS)
    error = usage_error("returns_z.py:empty_dataset")
    assert "the loader 'loader' from empty_dataset() in returns_z.py has no batches" in error.message
    assert "its dataset is empty" in error.message


def test_loader_without_batches_because_the_sampler_selects_nothing(project):
    project("returns_z.py", RETURNS)
    error = usage_error("returns_z.py:empty_sampler")
    assert "selects none of the 5 samples" in error.message


def test_workload_without_batches_is_closed_before_the_error(project):
    project("returns_z.py", RETURNS)
    error = usage_error("returns_z.py:empty_workload")
    assert "the loader 'val'" in error.message
    assert sys.modules["returns_z"].CLOSED == [True]


# --- describe_exception ---------------------------------------------------------------------------------------


def test_describe_exception_without_a_traceback():
    assert describe_exception(ValueError("bad value")) == "ValueError: bad value"
    assert describe_exception(KeyError("k")) == "KeyError: 'k'"
    assert describe_exception(RuntimeError()) == "RuntimeError"


def test_describe_exception_points_at_the_innermost_user_frame(project):
    project("user_code_aa.py", "def fail():\n    return {}['missing']\n")
    sys.path.insert(0, os.getcwd())
    import user_code_aa

    with pytest.raises(KeyError) as caught:
        user_code_aa.fail()
    assert describe_exception(caught.value) == "KeyError: 'missing' (at user_code_aa.py:2 in fail)"


def test_describe_exception_of_a_syntax_error():
    with pytest.raises(SyntaxError) as caught:
        compile("def f(:\n", os.path.join(os.getcwd(), "broken.py"), "exec")
    assert describe_exception(caught.value).startswith("SyntaxError: ")
    assert describe_exception(caught.value).endswith("(at broken.py:1)")


# --- built-in scenarios ---------------------------------------------------------------------------------------


def test_demo_resolves_to_a_workload_with_a_train_loader():
    with resolve("demo") as resolved:
        assert isinstance(resolved.workload, Workload)
        assert "train" in resolved.loaders
        assert resolved.loaders["train"] is resolved.workload.train


def test_scenario_form_resolves_the_named_scenario():
    with resolve("scenario:demo") as resolved:
        assert "train" in resolved.loaders
