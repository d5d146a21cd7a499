"""One read-only symbol as an ELF relocatable object: how an exported library carries its
VM bytecode and weights, written without LLVM or an assembler.

Why: TVM packs that blob through LLVM (``ModulePackImportsToLLVM``), which spends ~0.65 s of
CPU on a ResNet-50's 100 MB of weights; the object holds nothing but the bytes and one global
symbol, so writing its ~300 bytes of ELF structure around them takes the time of the write.

The object may leave a hole where the bytes go (``hole=True``), which the linked library then
has as zeros for ``fill_symbol`` to overwrite: the bytes are written once, into the library,
instead of into the object, read by the linker and written again. On this VM, whose fresh pages
cost ~5-10 µs each, BERT-base's 416 MB object took 2.7-6.4 s to write (measured).
"""

from __future__ import annotations

import os
import platform
import struct
import sys
from typing import BinaryIO

#: e_machine of the hosts this writer knows (little-endian, no ABI flags the linker checks).
_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_SHF_ALLOC = 2
_DATA_ALIGN = 16


def host_machine() -> int | None:
    """This host's ELF machine number, or None where the writer should not be used (not Linux,
    or an architecture it does not know)."""
    if not sys.platform.startswith("linux"):
        return None
    return _MACHINES.get(platform.machine().lower())


def write_rodata_object(handle: BinaryIO, symbol: str, data: memoryview, machine: int, *, hole: bool = False) -> None:
    """Write a relocatable object whose ``.rodata`` is ``data`` and whose one global object
    symbol, ``symbol``, names all of it (what ``.globl``/``.incbin`` in assembly would give);
    ``hole``: ``data.nbytes`` of file left unwritten (zeros, sparse where the file system can)."""
    size = data.nbytes
    names = b"\0.rodata\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab\0"
    strtab = b"\0" + symbol.encode() + b"\0"
    symtab = _SYMBOL.pack(0, 0, 0, 0, 0, 0) + _SYMBOL.pack(1, 0x11, 0, 1, 0, size)  # STB_GLOBAL | STT_OBJECT
    data_at = _HEADER.size + (-_HEADER.size % _DATA_ALIGN)
    symtab_at = data_at + size + (-(data_at + size) % 8)
    strtab_at = symtab_at + len(symtab)
    names_at = strtab_at + len(strtab)
    sections_at = names_at + len(names) + (-(names_at + len(names)) % 8)

    def name_of(section: bytes) -> int:
        return names.index(b"\0" + section + b"\0") + 1

    sections = [
        _SECTION.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        _SECTION.pack(name_of(b".rodata"), _SHT_PROGBITS, _SHF_ALLOC, 0, data_at, size, 0, 0, _DATA_ALIGN, 0),
        _SECTION.pack(name_of(b".note.GNU-stack"), _SHT_PROGBITS, 0, 0, data_at + size, 0, 0, 0, 1, 0),
        # link: the string table of the names; info: the first global symbol
        _SECTION.pack(name_of(b".symtab"), _SHT_SYMTAB, 0, 0, symtab_at, len(symtab), 4, 1, 8, _SYMBOL.size),
        _SECTION.pack(name_of(b".strtab"), _SHT_STRTAB, 0, 0, strtab_at, len(strtab), 0, 0, 1, 0),
        _SECTION.pack(name_of(b".shstrtab"), _SHT_STRTAB, 0, 0, names_at, len(names), 0, 0, 1, 0),
    ]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    handle.write(_HEADER.pack(ident, 1, machine, 1, 0, 0, sections_at, 0, _HEADER.size, 0, 0, _SECTION.size,
                              len(sections), len(sections) - 1))
    handle.write(bytes(data_at - _HEADER.size))
    if hole:
        handle.seek(size, os.SEEK_CUR)
    else:
        handle.write(data)
    handle.write(bytes(symtab_at - data_at - size))
    handle.write(symtab + strtab + names + bytes(sections_at - names_at - len(names)))
    handle.write(b"".join(sections))


_PROGRAM = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr
_PT_LOAD, _SHT_DYNSYM = 1, 11


def fill_symbol(path: str, symbol: str, data: memoryview) -> bool:
    """Write ``data`` over the bytes of the dynamic symbol ``symbol`` in the linked 64-bit
    little-endian ELF file ``path``, where the symbol is exactly ``data.nbytes`` long and lies in
    the file image of a loaded segment; False, having written nothing, otherwise."""
    with open(path, "r+b") as handle:
        located = _symbol_offset(handle.fileno(), symbol)
        if located is None or located[1] != data.nbytes:
            return False
        offset, written = located[0], 0
        with memoryview(data).cast("B") as raw:
            while written < raw.nbytes:
                written += os.pwrite(handle.fileno(), raw[written:written + (1 << 30)], offset + written)
    return True


def _symbol_offset(fd: int, symbol: str) -> tuple[int, int] | None:
    """(file offset, size) of the dynamic symbol ``symbol`` in the ELF file open as ``fd``."""
    header = os.pread(fd, _HEADER.size, 0)
    if len(header) < _HEADER.size or header[:6] != b"\x7fELF\x02\x01":
        return None
    fields = _HEADER.unpack(header)
    program_at, sections_at, program_size, program_count, section_size, section_count = (
        fields[5], fields[6], fields[9], fields[10], fields[11], fields[12])
    if program_size != _PROGRAM.size or section_size != _SECTION.size:
        return None
    sections = [_SECTION.unpack(os.pread(fd, _SECTION.size, sections_at + i * _SECTION.size))
                for i in range(section_count)]
    value = size = None
    for section in sections:
        if section[1] != _SHT_DYNSYM or section[6] >= len(sections):
            continue
        names = sections[section[6]]
        strings = os.pread(fd, names[5], names[4])
        table = os.pread(fd, section[5], section[4])
        for at in range(0, len(table) - _SYMBOL.size + 1, _SYMBOL.size):
            name, _info, _other, _index, value_at, size_of = _SYMBOL.unpack_from(table, at)
            if strings[name:strings.find(b"\0", name)] == symbol.encode():
                value, size = value_at, size_of
    if value is None or size is None:
        return None
    for i in range(program_count):
        kind, _flags, offset, vaddr, _paddr, file_size, _memsz, _align = _PROGRAM.unpack(
            os.pread(fd, _PROGRAM.size, program_at + i * _PROGRAM.size))
        if kind == _PT_LOAD and vaddr <= value and value + size <= vaddr + file_size:
            return offset + value - vaddr, size
    return None
