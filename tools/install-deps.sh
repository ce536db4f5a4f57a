#!/bin/sh
# Installs the Debian packages that building, testing and running beamd need.
# Quick no-op when everything is present; needs root (or sudo) otherwise.
set -e
PKGS="build-essential pkg-config clang libclang-rt-14-dev
libzmq3-dev libuv1-dev libyaml-dev libhdf5-dev hdf5-tools libfftw3-dev
libjansson-dev libcmocka-dev libsystemd-dev liblz4-dev libzstd-dev libopenblas-dev liblapacke-dev
bitshuffle hdf5-filter-plugin
libpng-dev libwebsockets-dev libwebsockets-evlib-uv libopenmpi-dev openmpi-bin chromium
python3 python3-zmq python3-numpy python3-pytest python3-h5py python3-lz4 python3-matplotlib python3-pil
python3-cbor2 python3-zstandard libmd-dev libmsgpack-dev python3-msgpack python3-scipy
python3-pyfai python3-xarray"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  echo "deps: all packages present"
  exit 0
fi
echo "deps: installing$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
