"""Node discovery reads real file formats: a GB10 with ConnectX-7, and a lab container with neither."""

from ansible_collections.sparkfleet.cluster.plugins.module_utils import node

MEMINFO = """MemTotal:       127539200 kB
MemFree:         9999999 kB
MemAvailable:   120512340 kB
SwapTotal:      16777212 kB
Hugepagesize:       2048 kB
"""

GB10_INFORMATION = """Model: \t\t NVIDIA GB10
IRQ:   \t\t 186
GPU UUID: \t GPU-00000000-0000-0000-0000-000000000000
Bus Location: \t 000f:01:00.0
"""


def write(root, path, text=""):
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_gb10_node(tmp_path):
    write(tmp_path, "/proc/meminfo", MEMINFO)
    write(tmp_path, "/etc/os-release", 'ID=ubuntu\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n')
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    write(tmp_path, "/proc/driver/nvidia/gpus/000f:01:00.0/information", GB10_INFORMATION)
    for dev, net in (("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")):
        write(tmp_path, f"/sys/class/infiniband/{dev}/device/net/{net}/mtu", "9000\n")
        write(tmp_path, f"/sys/class/infiniband/{dev}/ports/1/state", "4: ACTIVE\n")
    facts = node.node_facts(str(tmp_path))
    assert facts["accelerator"] == {"kind": "nvidia", "count": 1,
                                    "devices": [{"bus_id": "000f:01:00.0", "model": "NVIDIA GB10"}]}
    assert facts["rdma"]["present"] is True
    assert facts["rdma"]["devices"] == [
        {"name": "roceP2p1s0f1", "netdevs": ["enP2p1s0f1np1"], "ports": ["1"]},
        {"name": "rocep1s0f1", "netdevs": ["enp1s0f1np1"], "ports": ["1"]},
    ]
    assert facts["memory"] == {"total_kib": 127539200, "available_kib": 120512340, "swap_total_kib": 16777212}
    assert facts["os"]["version_id"] == "24.04"
    assert facts["container"] is None
    assert facts["init"] == "systemd"


def test_lab_container(tmp_path):
    write(tmp_path, "/proc/meminfo", MEMINFO)
    write(tmp_path, "/etc/os-release", 'ID=debian\nVERSION_ID="12"\n')
    write(tmp_path, "/run/systemd/container", "docker\n")
    facts = node.node_facts(str(tmp_path))
    assert facts["accelerator"] == {"kind": "none", "count": 0, "devices": []}
    assert facts["rdma"] == {"present": False, "devices": []}
    assert facts["container"] == "docker"
    assert facts["os"]["pretty_name"] == "unknown"


def test_meminfo_parses_parenthesised_fields(tmp_path):
    write(tmp_path, "/proc/meminfo", "Active(anon):    1234 kB\nMemAvailable: 10 kB\n")
    assert node.meminfo(str(tmp_path)) == {"Active(anon)": 1234, "MemAvailable": 10}


def test_a_host_not_run_by_systemd_names_its_pid_1(tmp_path):
    write(tmp_path, "/proc/1/comm", "process_api\n")
    assert node.node_facts(str(tmp_path))["init"] == "process_api"


def test_a_docker_container_without_systemd_is_known_by_its_read_only_kernel_settings(tmp_path):
    write(tmp_path, "/.dockerenv", "")
    write(tmp_path, "/proc/mounts", "overlay / overlay rw 0 0\nproc /proc proc rw,nosuid 0 0\n"
                                    "proc /proc/sys proc ro,nosuid,nodev,noexec,relatime 0 0\n")
    assert node.container_kind(str(tmp_path)) == "docker"


def test_a_vm_built_from_a_container_image_is_not_a_container(tmp_path):
    # CI's Firecracker VMs keep the image's /.dockerenv but own their kernel (/proc/sys writable).
    write(tmp_path, "/.dockerenv", "")
    write(tmp_path, "/proc/mounts", "/dev/vda / ext4 rw 0 0\nproc /proc proc rw,relatime 0 0\n")
    assert node.container_kind(str(tmp_path)) is None
