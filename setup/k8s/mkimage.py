#!/usr/bin/env python3
"""A folder as a one-layer docker-archive image, for `ctr images import` (nothing pulled).

Usage: mkimage.py ROOTFS_DIR NAME:TAG OUT.tar ENTRYPOINT_JSON CMD_JSON
"""

import hashlib
import io
import json
import os
import sys
import tarfile


def main() -> None:
    rootfs, ref, out, entrypoint, command = sys.argv[1:6]
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name in sorted(os.listdir(rootfs)):
            layer.add(os.path.join(rootfs, name), arcname=name)
    layer_bytes = layer_buffer.getvalue()
    diff = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": json.loads(entrypoint),
            "Cmd": json.loads(command),
            "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff]},
        "history": [{"created_by": "mkimage.py"}],
    }
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]
    with tarfile.open(out, "w") as image:
        for name, data in (
            (config_name, config_bytes),
            ("layer.tar", layer_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            image.addfile(info, io.BytesIO(data))
    print(out, ref, diff)


if __name__ == "__main__":
    main()
