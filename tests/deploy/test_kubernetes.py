"""deploy/kubernetes/: every manifest valid for the Kubernetes versions it is
for (strict: an unknown field is an error), and what the manifests and the
sidecar must agree on: the config the ConfigMap carries loads with the
variables the Secret brings, the probes reach the port the config listens on,
the grace period outlasts the sidecar's shutdown."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cdc.config import Config, load_config
from cdc.config_addresses import parse_health_address
from cdc.daemon import SHUTDOWN_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
# 1.29: native sidecars (restartPolicy: Always on an init container) on by default (beta);
# 1.33: generally available. https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/
VERSIONS = ("1.29.0", "1.33.0")
# What the sidecar's shutdown may take beyond its ordered part (cdc/daemon.py close():
# the health server's stop waits up to 2 s, then the connections close), and the app's own
# stop before it (a native sidecar is stopped after the app containers).
SHUTDOWN_MARGIN = 15


def kustomization() -> dict[str, Any]:
    return _yaml(KUBE / "kustomization.yaml")


def _yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), path
    return data


def generated_config_maps() -> list[dict[str, Any]]:
    """The ConfigMaps kustomize makes of ``configMapGenerator`` (its files as keys)."""
    maps = []
    for generator in kustomization().get("configMapGenerator", []):
        data = {Path(name).name: (KUBE / name).read_text(encoding="utf-8") for name in generator["files"]}
        maps.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return maps


# Created once by hand (`kubectl create secret`), never by `kubectl apply -k`: as a
# resource of the kustomization, every config rollout would write its placeholders
# back over the real Secret.
SECRET_EXAMPLE = "secret.example.yaml"


def resources() -> list[dict[str, Any]]:
    """Every object the pod needs: what ``kubectl apply -k deploy/kubernetes`` creates,
    and the Secret created apart."""
    names = [*kustomization()["resources"], SECRET_EXAMPLE]
    objects = [doc for name in names for doc in yaml.safe_load_all((KUBE / name).read_text())]
    return objects + generated_config_maps()


def find(kind: str, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (found,) = [o for o in (objects if objects is not None else resources()) if o["kind"] == kind]
    return found


def sidecar(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "cdc-sync"
    ]
    return container


def secret_environment() -> dict[str, str]:
    """The sidecar's environment as the pod gets it: each variable from its Secret key."""
    objects = resources()
    secret = find("Secret", objects)
    environment = {}
    for variable in sidecar(find("Deployment", objects))["env"]:
        reference = variable["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret["metadata"]["name"], variable
        environment[variable["name"]] = secret["stringData"][reference["key"]]
    return environment


def pod_config(tmp_path: Path) -> Config:
    """tables.yaml as the sidecar loads it in the pod (the file the ConfigMap mounts)."""
    deployment = find("Deployment")
    container = sidecar(deployment)
    config_path = Path(container["args"][container["args"].index("-c") + 1])
    (mount,) = [m for m in container["volumeMounts"] if config_path.parent == Path(m["mountPath"])]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [
        m for m in generated_config_maps() if m["metadata"]["name"] == volume["configMap"]["name"]
    ]
    copy_path = tmp_path / config_path.name
    copy_path.write_text(config_map["data"][config_path.name], encoding="utf-8")
    return load_config(copy_path, environ=secret_environment())


# -- the schemas -----------------------------------------------------------------


def test_every_file_of_the_directory_is_applied_or_generated() -> None:
    """A manifest added beside the others but left out of kustomization.yaml would be
    applied by nobody and validated by no test."""
    generated = {name for g in kustomization().get("configMapGenerator", []) for name in g["files"]}
    accounted = {"kustomization.yaml", SECRET_EXAMPLE, *kustomization()["resources"], *generated}
    assert {p.name for p in KUBE.glob("*.y*ml")} == accounted


def test_the_secret_is_never_applied_by_the_kustomization() -> None:
    assert not any(o["kind"] == "Secret" for name in kustomization()["resources"] for o in _objects(name))


def test_the_image_tag_is_this_version_and_the_docs_build_it() -> None:
    """The kustomization pulls the tag the docs' build command makes: this version's."""
    version = _project_version()
    (image,) = kustomization()["images"]
    assert str(image["newTag"]) == version
    assert f"docker build -t cdc-sync:{version} ." in (ROOT / "docs" / "KUBERNETES.md").read_text()


def _objects(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((KUBE / name).read_text()))


def _project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match
    return match.group(1)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    objects = resources()
    assert {o["kind"] for o in objects} == {"Deployment", "Secret", "ConfigMap"}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def _misspelt_probe(deployment: dict[str, Any]) -> None:
    sidecar(deployment)["livenessProbe"]["httpGet"]["paht"] = "/healthz"


def _replicas_as_text(deployment: dict[str, Any]) -> None:
    deployment["spec"]["replicas"] = "three"


def _container_without_name(deployment: dict[str, Any]) -> None:
    del sidecar(deployment)["name"]


@pytest.mark.parametrize("breakage", [_misspelt_probe, _replicas_as_text, _container_without_name])
def test_a_broken_manifest_is_refused(breakage: Any) -> None:
    """The validation above can fail: an unknown field, a wrong type, a missing name."""
    deployment = copy.deepcopy(find("Deployment"))
    breakage(deployment)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


# -- what the manifests and the sidecar agree on -------------------------------------


def test_the_config_map_loads_as_the_sidecar_loads_it_with_the_secrets_variables(tmp_path: Path) -> None:
    config = pod_config(tmp_path)
    assert config.source.dsn == secret_environment()["CDC_SOURCE_DSN"]
    assert config.redis.url == secret_environment()["CDC_REDIS_URL"]
    text = (KUBE / "tables.yaml").read_text(encoding="utf-8")
    assert set(re.findall(r"\$\{([A-Z_]+)", text)) == set(secret_environment())


def test_the_probes_reach_the_port_the_config_listens_on_from_outside_the_pod(tmp_path: Path) -> None:
    config = pod_config(tmp_path)
    assert config.worker.health is not None
    host, port = config.worker.health
    assert host in ("0.0.0.0", "::")  # the kubelet probes the pod's IP, not its loopback
    container = sidecar(find("Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {
        kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {kind: ports[probe["port"]] for kind, probe in probes.items()} == dict.fromkeys(probes, port)
    assert {kind: probe["path"] for kind, probe in probes.items()} == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",  # 200 while the source or Redis is away: no restart for their outage
        "readinessProbe": "/healthz",
    }


def test_the_grace_period_outlasts_the_sidecars_shutdown() -> None:
    spec = find("Deployment")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= SHUTDOWN_TIMEOUT + SHUTDOWN_MARGIN


def test_the_sidecar_is_a_native_sidecar_running_as_the_images_user_on_a_read_only_root() -> None:
    container = sidecar(find("Deployment"))
    assert container["restartPolicy"] == "Always"
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    (image_user,) = re.findall(r"(?m)^USER (\d+):(\d+)$", dockerfile)
    context = container["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == image_user
    assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"]
    assert not context["allowPrivilegeEscalation"] and context["capabilities"]["drop"] == ["ALL"]
    assert container["args"][:2] == ["--json-logs", "run"]


def test_the_config_port_parses_as_the_sidecar_parses_it() -> None:
    """The pod's address is one `worker.health` accepts (cdc/config_addresses.py)."""
    text = _yaml(KUBE / "tables.yaml")
    assert parse_health_address(text["worker"]["health"]) == ("0.0.0.0", 9478)


def test_several_replicas_share_the_tables() -> None:
    spec = find("Deployment")["spec"]
    assert spec["replicas"] > 1
    # a rolling update keeps every old pod until its replacement is ready
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
