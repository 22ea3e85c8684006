// The five libudev calls in Debian's static libhwloc, for the static dtrun:
// libudev has no static library, and hwloc uses it only to name block and
// network devices' serial numbers, which --numa-binding never reads. Each
// answers as libudev does when udev is not there (udev_new() returns NULL),
// and hwloc then goes on without it.
extern "C" {

struct udev;
struct udev_device;

struct udev* udev_new() {
  return nullptr;
}
struct udev* udev_unref(struct udev*) {
  return nullptr;
}
struct udev_device* udev_device_new_from_subsystem_sysname(struct udev*,
                                                           const char*,
                                                           const char*) {
  return nullptr;
}
struct udev_device* udev_device_unref(struct udev_device*) {
  return nullptr;
}
const char* udev_device_get_property_value(struct udev_device*, const char*) {
  return nullptr;
}

}  // extern "C"
