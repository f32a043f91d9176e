# Thin wrapper over CMake for the README's two commands.
BUILD ?= build
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup build run test asan clean

setup:
	@./scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j2 -- --no-print-directory >/dev/null

run: build
	./$(BUILD)/engine run envs/hello.lua --agent oracle

test: build
	@BUILD=$(BUILD) ./scripts/test.sh

asan:
	@$(MAKE) --no-print-directory test BUILD=build-asan \
	  CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DENGINE_SANITIZE=ON"

clean:
	rm -rf build build-asan
