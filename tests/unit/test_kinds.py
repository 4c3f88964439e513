"""The closed sets of names (wire/kinds.py) and what is derived from them: a name added in one place
and forgotten in another fails here."""

from gaudi_cluster.env.presets import PRESETS
from gaudi_cluster.launch.launchers import LAUNCHERS
from gaudi_cluster.settings.config import SETTINGS, ClusterConfig
from gaudi_cluster.wire.kinds import AUTO, Accelerator, EnvPreset, LauncherName


def choices_of(name: str) -> tuple[str, ...]:
    spec = next(s for s in SETTINGS if s.name == name)
    return tuple(spec.parse.choices)


def test_every_launcher_name_has_its_class_and_is_a_choice():
    assert set(LAUNCHERS) == set(LauncherName)
    assert all(LAUNCHERS[name].name == name for name in LauncherName)
    assert choices_of("launcher") == tuple(LauncherName)


def test_every_preset_has_its_function_and_is_a_choice():
    assert set(PRESETS) == set(EnvPreset)
    assert choices_of("env_preset") == (AUTO, *EnvPreset)


def test_accelerators_are_the_settings_choices_and_equal_their_strings():
    assert choices_of("accelerator") == (AUTO, "hpu", "cuda", "cpu")
    assert Accelerator.HPU == "hpu" and f"{Accelerator.CPU}" == "cpu"
    assert ClusterConfig().accelerator == AUTO
