# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Modules imported from the zip Ansible ships a module in (or the node CLI's zipapp), one compile per module.

zipimport compiles a module twice: its `find_spec` asks `importlib.util.spec_from_loader` for the spec, which
calls `zipimporter.get_filename`, which compiles the module to find where it would come from, and
`exec_module` compiles it again (CPython Lib/zipimport.py, `get_filename` -> `_get_module_code`; an
AnsiballZ payload holds sources only, no .pyc). A no-op `vgpu_profile` run compiled the node engine's ~30
modules and the Ansible module_utils they import twice each.

Importing this file installs a finder first on `sys.meta_path` (`install()`) that makes, for the modules
below the zip this package came from, the spec zipimport would make: from the zip's directory
(`is_package`) and the module's path inside it, without compiling; the same zipimporter still loads the
module, once. Where this package was not imported from a zip (a checkout, an installed collection, the
controller), it installs nothing. A module imports it before the other collection files.
"""

from __future__ import annotations

import os
import sys
import zipimport
from importlib.machinery import ModuleSpec

PACKAGE = "ansible_collections.accelops.vgpu.plugins.module_utils"


class CompileOnce:
    """A meta path finder for the modules below the zip `archive`: zipimport's spec, without its compile."""

    def __init__(self, archive):
        self.archive = archive
        self.below = archive + os.sep

    def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
        for entry in path or ():
            if not entry.startswith(self.below):
                continue
            importer = sys.path_importer_cache.get(entry)
            if not isinstance(importer, zipimport.zipimporter):
                try:
                    importer = zipimport.zipimporter(entry)
                except zipimport.ZipImportError:
                    continue
                sys.path_importer_cache[entry] = importer
            try:
                package = importer.is_package(fullname)   # the zip's directory: no read, no compile
            except zipimport.ZipImportError:          # not in this entry
                continue
            base = "%s%s%s%s" % (importer.archive, os.sep, importer.prefix, fullname.rpartition(".")[2])
            spec = ModuleSpec(fullname, importer, origin=base + (os.sep + "__init__.py" if package else ".py"),
                              is_package=package)
            spec.has_location = True      # __file__, as zipimport's own spec sets it
            if package:
                spec.submodule_search_locations = [base]
            return spec
        return None


def install():
    """CompileOnce first on sys.meta_path, for the zip this package came from (an AnsiballZ payload, the node
    CLI); elsewhere nothing."""
    loader = getattr(getattr(sys.modules.get(PACKAGE), "__spec__", None), "loader", None)
    if isinstance(loader, zipimport.zipimporter) and not any(isinstance(f, CompileOnce) for f in sys.meta_path):
        sys.meta_path.insert(0, CompileOnce(loader.archive))


install()
