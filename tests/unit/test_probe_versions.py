"""The probe's package versions: read from the distributions' directory names, as importlib.metadata
would report them."""

from __future__ import annotations

import importlib.metadata

from gaudi_cluster.nodes import probe


def test_versions_match_importlib_metadata_for_this_environment():
    expected = {}
    for name in probe.PACKAGES:
        try:
            expected[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected[name] = None
    assert probe.package_versions() == expected
    assert expected["torch"] is not None  # the venv has it: the comparison is not all None


def test_names_are_compared_as_packaging_does_and_an_egg_is_asked_of_metadata(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    installed = {
        # METADATA's Version is what counts, not the directory's name (a node patched in place).
        first: {"optimum_habana-1.18.1.dist-info": "1.18.1", "torch-2.6.0+cpu.dist-info": "2.6.0+patched"},
        # A path later on sys.path never wins over an earlier one; an egg names no version here, and a
        # dist-info without METADATA is asked of importlib.metadata too.
        second: {
            "torch-1.0.0.dist-info": "1.0.0",
            "DeepSpeed.egg-info": None,
            "Habana.Torch_Plugin-1.21.0.dist-info": "1.21.0",
            "transformers-4.0.dist-info": None,
        },
    }
    for place, dists in installed.items():
        place.mkdir()
        (place / "notes.txt").write_text("not a distribution")
        for name, version in dists.items():
            (place / name).mkdir()
            if version is not None and name.endswith(".dist-info"):
                (place / name / "METADATA").write_text(
                    f"Metadata-Version: 2.1\nName: x\nVersion: {version}\n\nBody"
                )
    monkeypatch.setattr(probe, "_metadata_version", lambda name: f"asked:{name}")
    assert probe.package_versions([str(first), str(second), str(tmp_path / "absent")]) == {
        "torch": "2.6.0+patched",
        "deepspeed": "asked:deepspeed",
        "transformers": "asked:transformers",
        "optimum-habana": "1.18.1",
        "habana-torch-plugin": "1.21.0",
    }
