// A CUDA injection library that records a run's real timeline: every kernel, copy and set on the
// device (start, end, stream) and every runtime and driver API call on the host (start, end), on
// CUPTI's one clock, written as CSV when the process exits. Nsight Compute times kernels one at a
// time; this shows the run as it ran: the gaps between kernels and whether the host had queued the
// next one yet (tools/gpu/trace/timeline.py reads the file). The GPU machine has no Nsight Systems.
//   g++ -O2 -shared -fPIC -I$CUDA/include tools/gpu/trace/cupti_trace.cpp -L$CUDA/lib64 -lcupti -o libcupti_trace.so
//   CUDA_INJECTION64_PATH=$PWD/libcupti_trace.so LOOM_TRACE_OUT=trace.csv build-gpu/tools/loom train ...
// Not part of the build: tools/gpu/trace/build.sh compiles it on the GPU machine.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;
std::mutex g_mu;
std::vector<std::string> g_rows;  // CSV rows, formatted as buffers complete
FILE* g_out = nullptr;

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  for (char& c : s)
    if (c == ',' || c == '\n') c = ';';  // one CSV field
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  char line[512];
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        std::snprintf(line, sizeof line, "kernel,%llu,%llu,%u,%u,%d,", static_cast<unsigned long long>(k->start),
                      static_cast<unsigned long long>(k->end), k->streamId, k->correlationId, k->gridX * k->gridY * k->gridZ);
        g_rows.push_back(line + demangle(k->name));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        std::snprintf(line, sizeof line, "memcpy,%llu,%llu,%u,%u,%llu,kind%u", static_cast<unsigned long long>(m->start),
                      static_cast<unsigned long long>(m->end), m->streamId, m->correlationId,
                      static_cast<unsigned long long>(m->bytes), static_cast<unsigned>(m->copyKind));
        g_rows.push_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        std::snprintf(line, sizeof line, "memset,%llu,%llu,%u,%u,%llu,", static_cast<unsigned long long>(m->start),
                      static_cast<unsigned long long>(m->end), m->streamId, m->correlationId,
                      static_cast<unsigned long long>(m->bytes));
        g_rows.push_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
        const char* name = nullptr;
        cuptiGetCallbackName(rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        std::snprintf(line, sizeof line, "%s,%llu,%llu,%u,%u,0,%s", rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? "runtime" : "driver",
                      static_cast<unsigned long long>(a->start), static_cast<unsigned long long>(a->end), a->threadId,
                      a->correlationId, name ? name : "?");
        g_rows.push_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        auto* s = reinterpret_cast<CUpti_ActivitySynchronization2*>(rec);
        std::snprintf(line, sizeof line, "sync,%llu,%llu,%u,%u,%u,", static_cast<unsigned long long>(s->start),
                      static_cast<unsigned long long>(s->end), s->streamId, s->correlationId, static_cast<unsigned>(s->type));
        g_rows.push_back(line);
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_out) return;
  std::fputs("what,start_ns,end_ns,stream_or_thread,correlation,extra,name\n", g_out);
  for (const std::string& r : g_rows) {
    std::fputs(r.c_str(), g_out);
    std::fputc('\n', g_out);
  }
  std::fclose(g_out);
  g_out = nullptr;
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, msg ? msg : "?");
  return false;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("LOOM_TRACE_OUT");
  g_out = std::fopen(path ? path : "cupti_trace.csv", "w");
  if (!g_out) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", path ? path : "cupti_trace.csv");
    return 0;
  }
  bool ok = check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                               CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION})
    ok = check(cuptiActivityEnable(k), "enable") && ok;
  std::atexit(finish);
  std::fprintf(stderr, "cupti_trace: recording to %s%s\n", path ? path : "cupti_trace.csv", ok ? "" : " (partly)");
  return 1;
}
