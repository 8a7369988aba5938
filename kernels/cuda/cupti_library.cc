#include "kernels/cuda/cupti_library.h"

#include <dlfcn.h>

#include <stdexcept>
#include <type_traits>

namespace dsmesh {
namespace {

CuptiLibrary LoadCupti() {
  CuptiLibrary api;
  // The bare name first: LD_LIBRARY_PATH (the GPU bundle's lib/) and the loader's cache; then the toolkit.
  const char* candidates[] = {"libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13",
                              "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                              "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13"};
  void* lib = nullptr;
  std::string tried;
  for (const char* c : candidates) {
    lib = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : c);
  }
  if (!lib) {
    api.error = "CUPTI (libcupti.so.13) could not be loaded (" + tried +
                "): the GPU bundle ships it in its lib/ folder (put that on LD_LIBRARY_PATH); a CUDA 13 toolkit has it "
                "in /usr/local/cuda/lib64";
    return api;
  }
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && api.error.empty()) api.error = std::string("CUPTI: libcupti.so.13 has no ") + name;
  };
  bind(api.enable, "cuptiActivityEnable");
  bind(api.disable, "cuptiActivityDisable");
  bind(api.register_callbacks, "cuptiActivityRegisterCallbacks");
  bind(api.flush_all, "cuptiActivityFlushAll");
  bind(api.next_record, "cuptiActivityGetNextRecord");
  bind(api.dropped_records, "cuptiActivityGetNumDroppedRecords");
  bind(api.timestamp, "cuptiGetTimestamp");
  bind(api.result_string, "cuptiGetResultString");
  bind(api.callback_name, "cuptiGetCallbackName");
  return api;
}

}  // namespace

const CuptiLibrary& Cupti() {
  static const CuptiLibrary api = LoadCupti();
  return api;
}

const CuptiLibrary& LoadedCupti() {
  const CuptiLibrary& api = Cupti();
  if (!api.error.empty()) throw std::runtime_error(api.error);
  return api;
}

void CheckCupti(CUptiResult r, const std::string& what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  if (!Cupti().result_string || Cupti().result_string(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
  throw std::runtime_error("CUPTI: " + what + ": " + s);
}

std::string CuptiLoadError() { return Cupti().error; }

std::string CuptiRuntimeCallName(uint32_t cbid) {
  const CuptiLibrary& api = LoadedCupti();
  const char* name = nullptr;
  if (api.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS || !name)
    return "runtime call " + std::to_string(cbid);
  std::string s = name;
  const size_t v = s.rfind("_v");
  if (v != std::string::npos && v + 2 < s.size() && s.find_first_not_of("0123456789", v + 2) == std::string::npos)
    s.resize(v);
  return s;
}

}  // namespace dsmesh
