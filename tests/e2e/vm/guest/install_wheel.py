"""Install a pure-Python wheel into the running venv: what pip does, minus pip's start-up.

Under TCG, ``pip install`` of gputuned's wheel took 28 s in the guest (pip itself imports for
most of that); unpacking it takes 2. A wheel (PEP 427) is a zip of the files to put into
site-packages plus a .dist-info folder; console scripts come from its entry_points.txt.
The dependencies are in the image already. Byte-code is compiled here, once.
"""

import compileall
import configparser
import os
import sys
import sysconfig
import zipfile


def main(wheel: str) -> None:
    site = sysconfig.get_paths()["purelib"]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    top = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")})
    eps = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = []
    if eps:
        cp = configparser.ConfigParser()
        cp.read(os.path.join(site, eps[0]))
        for name, target in cp["console_scripts"].items() if "console_scripts" in cp else []:
            module, _, func = target.partition(":")
            path = os.path.join(sys.prefix, "bin", name)
            with open(path, "w") as f:
                f.write(
                    f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\n"
                    f"sys.exit({func}())\n"
                )
            os.chmod(path, 0o755)
            scripts.append(path)
    for t in top:
        if os.path.isdir(os.path.join(site, t)):
            compileall.compile_dir(os.path.join(site, t), quiet=1)
    print(
        f"installed {os.path.basename(wheel)} into {site}: {', '.join(top)}; {', '.join(scripts)}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
