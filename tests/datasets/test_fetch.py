"""The fetch chain against a local HTTP server: good, truncated, corrupt and gzipped files,
hand-placed files, and the catalog behind `ksae-data list / fetch / verify`."""
from __future__ import annotations

import gzip
import hashlib
import http.server
import threading
from dataclasses import replace

import numpy as np
import pytest

from ksae_cupy.datasets import catalog
from ksae_cupy.datasets.fetch import FileSpec, HttpSource, ensure_files, verify_file
from ksae_cupy.datasets.idx import read_idx, write_idx
from ksae_cupy.datasets.registry import DATASETS, DatasetEntry
from ksae_cupy.errors import KsaeError

PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict = {}  # path -> (body, announced Content-Length or None for the true one)

    def do_GET(self):
        if self.path not in self.routes:
            self.send_error(404)
            return
        body, announced = self.routes[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if announced is None else announced))
        self.end_headers()
        self.wfile.write(body)  # a short body with a larger Content-Length = a cut connection
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    routes = {
        "/good/f.bin": (PAYLOAD, None),
        "/good/f.bin.gz": (gzip.compress(PAYLOAD), None),
        "/cut/f.bin": (PAYLOAD[:4000], len(PAYLOAD)),             # connection drops mid-file
        "/short/f.bin": (PAYLOAD[:4000], None),                   # complete transfer of a short file
        "/cutgz/f.bin.gz": (gzip.compress(PAYLOAD)[:200], None),  # truncated gzip stream
        "/wrong/f.bin": (PAYLOAD[::-1], None),                    # right size, wrong bytes
    }
    _Handler.routes = routes
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def src(server, folder, gzipped=False):
    return HttpSource(f"{server}/{folder}/", gzipped=gzipped)


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_good_file_is_fetched_verified_and_renamed(server, tmp_path):
    paths = ensure_files(tmp_path, [FileSpec("f.bin", SHA)], [src(server, "good")], "demo", log=lambda m: None)
    assert paths["f.bin"].read_bytes() == PAYLOAD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]  # no .part, no scratch folder left


def test_gzipped_source_is_decompressed(server, tmp_path):
    ensure_files(tmp_path, [FileSpec("f.bin", md5=MD5)], [src(server, "good", gzipped=True)], "demo", log=lambda m: None)
    assert (tmp_path / "f.bin").read_bytes() == PAYLOAD


@pytest.mark.parametrize("bad, gzipped, spec", [
    ("cut", False, FileSpec("f.bin", SHA)),                   # Content-Length says more than came
    ("cutgz", True, FileSpec("f.bin", SHA)),                  # gzip stream ends early
    ("wrong", False, FileSpec("f.bin", SHA)),                 # checksum mismatch
    ("wrong", False, FileSpec("f.bin", md5=MD5)),
    ("short", False, FileSpec("f.bin", size=len(PAYLOAD))),   # no checksum: size catches truncation
])
def test_bad_source_falls_through_to_the_next(server, tmp_path, bad, gzipped, spec):
    messages = []
    sources = [src(server, bad, gzipped), src(server, "good")]
    ensure_files(tmp_path, [spec], sources, "demo", log=messages.append)
    assert (tmp_path / "f.bin").read_bytes() == PAYLOAD
    # The source named before each try, the fallback announced with why, then where the file came from.
    assert messages[0] == f"fetching f.bin from {sources[0].describe()}" and len(messages) == 3
    assert messages[1].startswith(f"falling back: {sources[0].describe()}: ")
    assert messages[1].endswith(f"; fetching f.bin from {sources[1].describe()}")
    assert messages[2] == f"fetched f.bin from {sources[1].describe()}"


@pytest.mark.parametrize("bad, gzipped, why", [
    ("cut", False, "truncated transfer"), ("cutgz", True, "EOFError"), ("wrong", False, "sha256"),
])
def test_no_good_source_is_one_line_naming_sources_and_hand_placement(server, tmp_path, bad, gzipped, why):
    sources = [src(server, bad, gzipped), src(server, "missing")]
    with pytest.raises(KsaeError) as info:
        ensure_files(tmp_path, [FileSpec("f.bin", SHA)], sources, "demo", log=lambda m: None)
    text = one_line(info)
    assert why in text and f"{server}/{bad}/" in text and f"{server}/missing/" in text and "404" in text
    assert f"in {tmp_path} by hand" in text and SHA in text
    assert not any(tmp_path.iterdir())  # nothing half-written under any name


def test_a_failed_fetch_lists_every_missing_file_and_leaves_no_empty_folder(server, tmp_path):
    folder = tmp_path / "data" / "demo"  # neither exists yet
    specs = [FileSpec(name, SHA) for name in ("a.bin", "b.bin", "c.bin", "d.bin")]
    messages = []
    with pytest.raises(KsaeError) as info:
        ensure_files(folder, specs, [src(server, "missing"), src(server, "wrong")], "demo", log=messages.append)
    text = one_line(info)
    assert "Still missing in" in text and "4 file(s) of demo: a.bin, b.bin, c.bin, d.bin" in text
    assert not (tmp_path / "data").exists()  # the folders made for the fetch are gone again
    assert messages == [f"fetching a.bin from {server}/missing/",
                        f"falling back: {server}/missing/: HTTPError: HTTP Error 404: Not Found; "
                        f"fetching a.bin from {server}/wrong/"]


def test_a_folder_that_was_there_stays(server, tmp_path):
    with pytest.raises(KsaeError):
        ensure_files(tmp_path, [FileSpec("a.bin", SHA)], [src(server, "missing")], "demo", log=lambda m: None)
    assert tmp_path.is_dir()


def test_hand_placed_files_plain_and_gz(tmp_path):
    (tmp_path / "f.bin").write_bytes(PAYLOAD)
    (tmp_path / "g.bin.gz").write_bytes(gzip.compress(PAYLOAD))
    specs = [FileSpec("f.bin", SHA), FileSpec("g.bin", SHA)]
    paths = ensure_files(tmp_path, specs, [], "demo", log=lambda m: None)  # no source needed
    assert paths == {"f.bin": tmp_path / "f.bin", "g.bin": tmp_path / "g.bin.gz"}


@pytest.mark.parametrize("name, content", [
    ("f.bin", PAYLOAD[:-1]),                            # truncated
    ("f.bin", PAYLOAD[:-1] + b"x"),                     # one byte changed
    ("f.bin.gz", gzip.compress(PAYLOAD)[:-30]),         # truncated .gz copy
])
def test_bad_hand_placed_file_is_refused_and_kept(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(KsaeError) as info:
        ensure_files(tmp_path, [FileSpec("f.bin", SHA)], [], "demo", log=lambda m: None)
    assert "fails its check" in one_line(info) and "ksae-data fetch demo" in str(info.value)
    assert (tmp_path / name).read_bytes() == content  # the user's file is never deleted


def test_spec_checks_combine_and_a_spec_needs_one():
    with pytest.raises(ValueError):
        FileSpec("nothing")
    spec = FileSpec("f.bin", md5=MD5, size=len(PAYLOAD), check=lambda path, opener: None)
    assert spec.describe() == f"md5 {MD5} + size {len(PAYLOAD)} bytes + format check"


def test_format_check_runs_on_decompressed_copy(tmp_path):
    def starts_right(path, opener):
        with opener(path, "rb") as f:
            if f.read(2) != PAYLOAD[:2]:
                raise ValueError("wrong leading bytes")
    (tmp_path / "f.bin.gz").write_bytes(gzip.compress(PAYLOAD))
    assert verify_file(tmp_path, FileSpec("f.bin", check=starts_right))[0] == "ok"
    (tmp_path / "f.bin.gz").write_bytes(gzip.compress(PAYLOAD[1:]))
    status, _, detail = verify_file(tmp_path, FileSpec("f.bin", check=starts_right))
    assert status == "bad" and "wrong leading bytes" in detail


def test_a_spec_named_gz_is_hashed_as_stored(tmp_path):
    # cifar-10-python.tar.gz: its published MD5 is of the compressed bytes.
    blob = gzip.compress(PAYLOAD)
    (tmp_path / "a.tar.gz").write_bytes(blob)
    assert verify_file(tmp_path, FileSpec("a.tar.gz", md5=hashlib.md5(blob).hexdigest()))[0] == "ok"


def test_idx_round_trip_and_bad_magic(tmp_path):
    X = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x-idx3-ubyte.gz", X)
    raw = gzip.decompress((tmp_path / "x-idx3-ubyte.gz").read_bytes())
    assert raw[:16] == bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4])
    np.testing.assert_array_equal(read_idx(tmp_path / "x-idx3-ubyte.gz"), X)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + raw[4:])
    with pytest.raises(KsaeError) as info:
        read_idx(tmp_path / "bad")
    assert "not an unsigned-byte IDX file" in one_line(info)


# --- catalog: ksae-data list / verify / fetch ----------------------------------------------

def demo_entry(files, sources) -> DatasetEntry:
    """A dataset with only files to fetch, in the data root's folder ``demo``."""
    return DatasetEntry("demo", "files to fetch", load=None, image_shape=(1, 1), folder="demo", files=tuple(files),
                        sources=tuple(sources))


def test_catalog_lists_every_builtin_dataset(tmp_path):
    from ksae_cupy.datasets.registry import DATASETS

    rows = catalog.list_datasets(tmp_path)
    assert {r[0] for r in rows} == set(DATASETS)
    assert dict((r[0], r[2]) for r in rows)["norb"] == f"0/4 files present in {tmp_path / 'norb'}"


def test_verify_all_names_bad_and_missing_files(tmp_path, monkeypatch):
    from ksae_cupy.datasets import norb

    for name, entry in DATASETS.items():  # this machine's system packages stay out of it
        monkeypatch.setitem(DATASETS, name, replace(entry, search=()))

    (tmp_path / "norb").mkdir()
    (tmp_path / "norb" / norb.TRAIN_CAT).write_bytes(b"\x54\x4c\x3d\x1e" + b"\x00" * 100)  # wrong size
    rows = catalog.verify_all(tmp_path)
    assert {r[0] for r in rows} == {"mnist", "fashion-mnist", "norb", "cifar-patches"}
    bad = [r for r in rows if r[2] == "bad"]
    assert [(r[0], r[1]) for r in bad] == [("norb", norb.TRAIN_CAT)]
    assert "104 bytes, expected 97220" in bad[0][3]
    assert all(r[2] == "missing" for r in rows if r not in bad)


def test_fetch_dataset_through_the_catalog(server, tmp_path, monkeypatch):
    monkeypatch.setitem(DATASETS, "demo", demo_entry([FileSpec("f.bin", SHA)], [src(server, "good")]))
    paths = catalog.fetch_dataset("demo", tmp_path, log=lambda m: None)
    assert paths["f.bin"] == tmp_path / "demo" / "f.bin"
    assert catalog.verify_all(tmp_path, ["demo"])[0][2] == "ok"
    assert catalog.fetch_dataset("patches", tmp_path, log=lambda m: None) == {}
    with pytest.raises(KsaeError) as info:
        catalog.fetch_dataset("imagenet", tmp_path)
    assert "unknown dataset 'imagenet'" in one_line(info)


# --- fashion-mnist: the fetch chain, Debian's package folder, the catalog --------------------------

def _fashion_files(server, monkeypatch, tmp_path):
    """Two small stand-in files for fashion-mnist's specs, served gzipped as its mirrors serve them."""
    from ksae_cupy.datasets import fashion_mnist

    bodies = {"train-labels-idx1-ubyte": PAYLOAD, "t10k-labels-idx1-ubyte": PAYLOAD[::-1]}
    specs = [FileSpec(name, hashlib.sha256(body).hexdigest()) for name, body in bodies.items()]
    for name, body in bodies.items():
        monkeypatch.setitem(_Handler.routes, f"/fashion/{name}.gz", (gzip.compress(body), None))
    monkeypatch.setattr(fashion_mnist, "FILES", specs)
    monkeypatch.setattr(fashion_mnist, "SOURCES", [src(server, "missing", gzipped=True), src(server, "fashion", True)])
    package = tmp_path / "usr-share-datasets-fashion-mnist"
    monkeypatch.setattr(fashion_mnist, "SEARCH", (package,))
    return fashion_mnist, bodies, package


def test_fashion_mnist_is_fetched_through_its_chain(server, tmp_path, monkeypatch):
    fashion_mnist, bodies, _ = _fashion_files(server, monkeypatch, tmp_path)
    messages = []
    paths = fashion_mnist.fetch(tmp_path / "fashion-mnist", log=messages.append)
    assert {name: path.read_bytes() for name, path in paths.items()} == bodies
    # The first mirror failed for each file, the second served: each fallback said, then where it came from.
    assert [m for m in messages if m.startswith("fetched")] == [
        f"fetched {name} from {fashion_mnist.SOURCES[1].describe()}" for name in bodies]
    assert sum(m.startswith("falling back: ") for m in messages) == len(bodies)


def test_fashion_mnist_files_of_the_debian_package_are_used_in_place(server, tmp_path, monkeypatch):
    fashion_mnist, bodies, package = _fashion_files(server, monkeypatch, tmp_path)
    package.mkdir()
    for name, body in bodies.items():
        (package / (name + ".gz")).write_bytes(gzip.compress(body))
    monkeypatch.setattr(fashion_mnist, "SOURCES", [])  # no network needed
    paths = fashion_mnist.fetch(tmp_path / "data" / "fashion-mnist", log=lambda m: None)
    assert paths == {name: package / (name + ".gz") for name in bodies}
    assert not (tmp_path / "data" / "fashion-mnist").exists()  # nothing copied into the data root


def test_a_damaged_copy_in_the_package_folder_is_passed_over(server, tmp_path, monkeypatch):
    fashion_mnist, bodies, package = _fashion_files(server, monkeypatch, tmp_path)
    package.mkdir()
    (package / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(PAYLOAD[:-1]))
    messages = []
    paths = fashion_mnist.fetch(tmp_path / "fashion-mnist", log=messages.append)
    assert paths["train-labels-idx1-ubyte"] == tmp_path / "fashion-mnist" / "train-labels-idx1-ubyte"
    assert any(m.startswith(f"passing over {package}") and "sha256" in m for m in messages)


def test_catalog_knows_fashion_mnist_and_its_package_folder(server, tmp_path, monkeypatch):
    fashion_mnist, bodies, package = _fashion_files(server, monkeypatch, tmp_path)
    monkeypatch.setitem(DATASETS, "fashion-mnist",
                        replace(DATASETS["fashion-mnist"], files=tuple(fashion_mnist.FILES), sources=(), search=(package,)))
    package.mkdir()
    for name, body in bodies.items():
        (package / (name + ".gz")).write_bytes(gzip.compress(body))
    listed = {row[0]: row[2] for row in catalog.list_datasets(tmp_path)}
    # Issue 55: "0/4 files present" though training reads the package's copy: say where it is read from.
    assert listed["fashion-mnist"] == f"2/2 files present in {package} (a system copy, read in place)"
    assert [row[2] for row in catalog.verify_all(tmp_path, ["fashion-mnist"])] == ["ok", "ok"]
    (tmp_path / "fashion-mnist").mkdir()
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte").write_bytes(b"")  # one file in the data root: first
    listed = {row[0]: row[2] for row in catalog.list_datasets(tmp_path)}
    assert listed["fashion-mnist"] == \
        f"2/2 files present in {tmp_path / 'fashion-mnist'} and {package} (a system copy, read in place)"


def test_the_official_fashion_mnist_files_match_their_digests():
    from ksae_cupy.datasets import fashion_mnist

    folder = fashion_mnist.SEARCH[0]
    if not folder.is_dir():
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({folder} is absent)")
    assert [verify_file(folder, spec)[0] for spec in fashion_mnist.FILES] == ["ok"] * 4


def test_ksae_data_fetch_prints_one_line_per_file_and_failures_only_when_all_failed(server, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ksae_cupy.cli.data import data_command

    specs = [FileSpec("f.bin", SHA), FileSpec("g.bin", SHA)]
    monkeypatch.setitem(_Handler.routes, "/good/g.bin", (PAYLOAD, None))
    mirrors = [src(server, "missing"), src(server, "wrong"), src(server, "good")]  # two fail for each file
    monkeypatch.setitem(DATASETS, "demo", demo_entry(specs, mirrors))
    fetched = CliRunner().invoke(data_command, ["fetch", "demo", "--data-dir", str(tmp_path)])
    assert fetched.exit_code == 0, fetched.output
    said = fetched.stderr.splitlines()
    assert [line for line in said if line.startswith("fetched")] == [
        f"fetched {name} from {server}/good/" for name in ("f.bin", "g.bin")]
    assert said[0] == f"fetching f.bin from {server}/missing/" and said[1].startswith(f"falling back: {server}/missing/")
    # Every source failing: one error line naming each failure, the only time failures are shown.
    monkeypatch.setitem(_Handler.routes, "/wrong/h.bin", (PAYLOAD[::-1], None))
    monkeypatch.setitem(DATASETS, "demo", demo_entry([FileSpec("h.bin", SHA)], mirrors[:2]))
    failed = CliRunner().invoke(data_command, ["fetch", "demo", "--data-dir", str(tmp_path)])
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert failed.exit_code == 2 and len(errors) == 1 and failed.stderr.splitlines()[-1] == errors[0], failed.output
    assert errors[0].startswith("error: could not fetch h.bin")
    assert f"{server}/missing/: HTTPError: HTTP Error 404" in failed.stderr and f"{server}/wrong/: h.bin sha256" in failed.stderr
