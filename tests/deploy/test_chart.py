"""deploy/ checked with the real tools: helm, the Kubernetes schemas, promtool.

``make test`` installs them (``make tools``): helm built from the Go proxy,
promtool from Debian's ``prometheus``, the schemas from PyPI's
``kubernetes-validate``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "pgsub"
SAMPLE = Path(__file__).with_name("values-sample.yaml")
KUBERNETES = "1.31.0"
CUSTOM = {"ServiceMonitor", "PrometheusRule"}  # the Prometheus Operator's CRDs


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(ROOT / ".tools" / "bin"))
    if found is None:
        pytest.fail(f"{name} is not installed: run `make tools` (make test does)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("helm"), *args], check=check, capture_output=True, text=True, timeout=120
    )


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], check=False, capture_output=True, text=True, cwd=cwd
    )


def render(*values: Path, settings: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", "pgsub", str(CHART)]
    for path in values:
        args += ["-f", str(path)]
    for setting in settings:
        args += ["--set", setting]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_the_chart_lints_with_default_and_sample_values() -> None:
    for values in ([], ["-f", str(SAMPLE)]):
        result = helm("lint", "--strict", str(CHART), *values, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_object_validates_against_the_schema_of_its_kind() -> None:
    import kubernetes_validate

    for values in ((), (SAMPLE,)):
        objects = render(*values)
        kinds = {o["kind"] for o in objects}
        assert {"StatefulSet", "Service", "ConfigMap", "ServiceAccount"} <= kinds
        for obj in objects:
            if obj["kind"] in CUSTOM:
                assert obj["apiVersion"] == "monitoring.coreos.com/v1"
                continue
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert {o["kind"] for o in render(SAMPLE)} >= CUSTOM


def test_one_pod_at_a_time_non_root_read_only_with_probes_the_daemon_serves() -> None:
    objects = render(SAMPLE)
    spec = of_kind(objects, "StatefulSet")["spec"]
    assert spec["replicas"] == 1 and spec["podManagementPolicy"] == "OrderedReady"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["terminationGracePeriodSeconds"] == 600
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": 9300, "protocol": "TCP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # The paths are the daemon's own (subscriber/runtime/http.py serves exactly these).
    served = (ROOT / "subscriber" / "runtime" / "http.py").read_text()
    assert '"/healthz"' in served and '"/readyz"' in served
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/pgsub", "/etc/pgsub/passwords", "/var/lib/pgsub"} <= mounts
    claims = [c["metadata"]["name"] for c in spec["volumeClaimTemplates"]]
    assert claims == ["spool"]  # the warehouse is s3a:// in the sample


def test_the_config_map_is_a_config_pgsub_accepts(tmp_path: Path) -> None:
    """The rendered pgsub.yaml passes pgsub's own validation, with the chart's port and each
    subscription's password file on the mounted Secret (no password anywhere in it)."""
    from subscriber.runtime.config_file import load

    data = of_kind(render(SAMPLE), "ConfigMap")["data"]["pgsub.yaml"]
    for name in ("orders", "events", "access_key_id", "secret_access_key"):  # the Secrets'
        (tmp_path / name).write_text("x")  # keys, as their mounts make them files
    path = tmp_path / "pgsub.yaml"
    data_here = data.replace("/etc/pgsub/passwords", str(tmp_path))
    path.write_text(data_here.replace("/etc/pgsub/storage", str(tmp_path)))
    config = load(path, environ={})
    assert config.metrics.port == 9300 and config.metrics.host == "0.0.0.0"
    assert [s.password_file for s in config.subscriptions] == [
        tmp_path / "orders",
        tmp_path / "events",
    ]
    assert "password=" not in data and "password:" not in data  # only password_file
    # The object store's key from its Secret's files: in no ConfigMap, in no environment.
    assert config.storage.access_key_id_file == tmp_path / "access_key_id"
    assert config.storage.storage().endpoint == "https://s3.example"
    assert "secret_access_key:" not in data


def test_the_values_schema_refuses_a_password_in_the_connection_string() -> None:
    bad = helm(
        "template",
        "pgsub",
        str(CHART),
        "-f",
        str(SAMPLE),
        "--set",
        "config.subscriptions[0].connection=host=db password=hunter2",
        check=False,
    )
    assert bad.returncode != 0 and "connection" in bad.stderr


def test_a_created_secret_holds_the_passwords_and_is_mounted() -> None:
    objects = render(settings=("passwords.create.sub1=s3cret",))
    secret = of_kind(objects, "Secret")
    assert secret["stringData"] == {"sub1": "s3cret"}
    volumes = of_kind(objects, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "passwords",
        "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o400},
    } in volumes


def test_alert_rules_pass_promtool_and_their_unit_tests(tmp_path: Path) -> None:
    rule = of_kind(render(SAMPLE), "PrometheusRule")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(Path(__file__).with_name("alerts-test.yaml"), tmp_path / "alerts-test.yaml")
    tested = promtool("test", "rules", "alerts-test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    tested_names = set(re.findall(r"alertname: (\w+)", (tmp_path / "alerts-test.yaml").read_text()))
    assert names == tested_names, "every alert has its unit tests"


def dashboard_queries() -> list[str]:
    board = json.loads((ROOT / "deploy" / "grafana" / "pgsub.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    return exprs + [v["query"] for v in board["templating"]["list"] if v.get("type") == "query"]


def test_the_dashboard_is_what_its_generator_makes_and_every_query_parses(
    tmp_path: Path,
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dashboard", ROOT / "deploy/grafana/dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (ROOT / "deploy" / "grafana" / "pgsub.json").read_text(), (
        "regenerate: python deploy/grafana/dashboard.py > deploy/grafana/pgsub.json"
    )
    exprs = [q for q in dashboard_queries() if not q.startswith("label_values(")]
    grafana = {"$__rate_interval": "5m", '"$subscription"': '".*"', '"$relation"': '".*"'}
    recorded = []
    for number, expr in enumerate(exprs):
        concrete = expr
        for variable, value in grafana.items():
            concrete = concrete.replace(variable, value)
        recorded.append({"record": f"pgsub:dashboard_query_{number}", "expr": concrete})
    rules = tmp_path / "dashboard.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def metric_names(text: str) -> set[str]:
    """The pgsub_* metric names a PromQL text mentions."""
    return set(re.findall(r"\bpgsub_[a-z_]+\b", text))


def queried_metrics() -> set[str]:
    """Every metric the dashboard and the alert rules query."""
    alerts = (CHART / "templates" / "_alerts.tpl").read_text()
    return metric_names(alerts) | metric_names("\n".join(dashboard_queries()))
