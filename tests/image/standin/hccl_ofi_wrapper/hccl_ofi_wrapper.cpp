// TEST-ONLY stand-in for HabanaAI/hccl_ofi_wrapper's source (never shipped): the shape HCCL >= 1.19 loads
// (an interface with a virtual destructor, ofi_plugin, the two C entry points) and a real call into
// libfabric, so that image/build-hccl-ofi-wrapper.sh's build, ABI check and loader checks run offline.
#include <memory>
#include <rdma/fabric.h>

class ofi_plugin_interface {
public:
    virtual ~ofi_plugin_interface() = default;
    virtual int initialize() = 0;
};

class ofi_plugin : public ofi_plugin_interface {
public:
    int initialize() override { return static_cast<int>(fi_version()); }
};

extern "C" double get_version() { return 1.2; }
extern "C" std::unique_ptr<ofi_plugin_interface>* create_ofi_plugin_handle() {
    return new std::unique_ptr<ofi_plugin_interface>(new ofi_plugin());
}
