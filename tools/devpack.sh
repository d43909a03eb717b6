#!/usr/bin/env bash
# Packs a build for the GPU machine (which can install nothing): the wren executable, the CUDA
# kernel checks and every shared library they load that is not part of glibc, into DEST.
# On the GPU machine: LD_LIBRARY_PATH=DEST/lib DEST/wren ...
# usage: tools/devpack.sh BUILD_DIR DEST
set -euo pipefail
build=$1 dest=$2
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/cuda_checks"
cp "$build/wren" "$dest/"
if compgen -G "$build/cuda_checks/*" >/dev/null; then cp "$build"/cuda_checks/* "$dest/cuda_checks/"; fi
for bin in "$dest/wren" "$dest"/cuda_checks/*; do
  [ -f "$bin" ] || continue
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      *) cp -L -n "$lib" "$dest/lib/" ;;
    esac
  done
done
du -sh "$dest"
