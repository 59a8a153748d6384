"""The build step pyproject.toml cannot express: a wheel carries the shipped models
(``assets/*.gguf``) and the Metal sources (``metal/*.metal``) inside the package, under
``ds4mlx/_data/`` (``ds4mlx/resources.py`` finds them there). An editable install uses the
source tree's folders instead."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = (("assets", "*.gguf"), ("metal", "*.metal"))


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        for folder, pattern in SHIPPED:
            target = Path(self.build_lib) / "ds4mlx" / "_data" / folder
            target.mkdir(parents=True, exist_ok=True)
            for source in sorted(Path(folder).glob(pattern)):
                shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildWithData})
