#include "availability/logind_probe.h"

#include <unistd.h>

#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"

#ifdef MINIONS_HAVE_SDBUS
#include <systemd/sd-bus.h>
#endif

namespace minions::availability {
namespace {
constexpr char kService[] = "org.freedesktop.login1";
constexpr char kManagerPath[] = "/org/freedesktop/login1";
constexpr char kManager[] = "org.freedesktop.login1.Manager";
constexpr char kSession[] = "org.freedesktop.login1.Session";

void Unknown(Snapshot* s, const std::string& why) {
  for (Signal<bool>* b : {&s->console_user, &s->screen_locked, &s->media_playing}) {
    *b = {};
    b->source = why;
  }
}
}  // namespace

#ifdef MINIONS_HAVE_SDBUS

struct LogindProbe::Bus {
  sd_bus* bus = nullptr;
  ~Bus() {
    if (bus) sd_bus_flush_close_unref(bus);
  }
};

namespace {

struct Session {
  std::string id, seat, path;
};

// Reads a property of the trivial D-Bus type `type` into a T (zero, and *ok false, when it cannot).
template <typename T>
T TrivialProperty(sd_bus* bus, const char* path, const char* iface, const char* name, char type, bool* ok) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  T value{};
  int r = sd_bus_get_property_trivial(bus, kService, path, iface, name, &error, type, &value);
  sd_bus_error_free(&error);
  if (r < 0) *ok = false;
  return value;
}

// Reads a boolean property; false when it cannot.
bool BoolProperty(sd_bus* bus, const char* path, const char* iface, const char* name, bool* ok) {
  return TrivialProperty<int>(bus, path, iface, name, 'b', ok) != 0;  // sd-bus reads a 'b' as an int
}

uint64_t U64Property(sd_bus* bus, const char* path, const char* iface, const char* name, bool* ok) {
  return TrivialProperty<uint64_t>(bus, path, iface, name, 't', ok);
}

// Calls the Manager's `method` (no arguments), which answers an array of `item` structs, and has
// `read` read each of them from the reply (its sd_bus_message_read result: <= 0 ends the array).
// A negative result where the call or a read failed.
int ForEachManagerItem(sd_bus* bus, const char* method, const char* item,
                       const std::function<int(sd_bus_message*)>& read) {
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* reply = nullptr;
  int r = sd_bus_call_method(bus, kService, kManagerPath, kManager, method, &error, &reply, "");
  sd_bus_error_free(&error);
  if (r < 0) return r;
  r = sd_bus_message_enter_container(reply, 'a', item);
  while (r >= 0) {
    r = read(reply);
    if (r <= 0) break;
  }
  sd_bus_message_unref(reply);
  return r;
}

int ListSessions(sd_bus* bus, std::vector<Session>* out) {
  return ForEachManagerItem(bus, "ListSessions", "(susso)", [&](sd_bus_message* reply) {
    const char *id, *user, *seat, *path;
    uint32_t uid;
    int r = sd_bus_message_read(reply, "(susso)", &id, &uid, &user, &seat, &path);
    if (r > 0) out->push_back({id, seat, path});
    return r;
  });
}

// Whether another process holds an "idle" inhibitor (a video player, a call).
int OthersInhibitIdle(sd_bus* bus, int own_pid, bool* inhibited) {
  *inhibited = false;
  return ForEachManagerItem(bus, "ListInhibitors", "(ssssuu)", [&](sd_bus_message* reply) {
    const char *what, *who, *why, *mode;
    uint32_t uid, pid;
    int r = sd_bus_message_read(reply, "(ssssuu)", &what, &who, &why, &mode, &uid, &pid);
    if (r > 0 && std::string(what).find("idle") != std::string::npos && static_cast<int>(pid) != own_pid) {
      *inhibited = true;
    }
    return r;
  });
}

}  // namespace

LogindProbe::LogindProbe(std::string bus_address, int own_pid)
    : address_(std::move(bus_address)), own_pid_(own_pid ? own_pid : getpid()) {}
LogindProbe::~LogindProbe() = default;

void LogindProbe::Fill(Snapshot* s, absl::Time now) {
  if (!bus_) {
    if (now < next_connect_) return Unknown(s, "logind: no system bus");
    next_connect_ = now + absl::Seconds(30);
    auto bus = std::make_unique<Bus>();
    int r;
    if (address_.empty()) {
      r = sd_bus_open_system(&bus->bus);
    } else {
      r = sd_bus_new(&bus->bus);
      if (r >= 0) r = sd_bus_set_address(bus->bus, address_.c_str());
      if (r >= 0) r = sd_bus_set_bus_client(bus->bus, 1);
      if (r >= 0) r = sd_bus_start(bus->bus);
    }
    if (r < 0) return Unknown(s, absl::StrCat("logind: cannot open the system bus: ", strerror(-r)));
    bus_ = std::move(bus);
  }
  sd_bus* bus = bus_->bus;
  std::vector<Session> sessions;
  bool inhibited = false;
  int r = ListSessions(bus, &sessions);
  if (r >= 0) r = OthersInhibitIdle(bus, own_pid_, &inhibited);
  if (r < 0) {
    bus_.reset();  // logind restarted or the bus went away: reconnect later
    return Unknown(s, absl::StrCat("logind: ", strerror(-r)));
  }
  bool ok = true;
  bool console = false, locked = false;
  for (const auto& session : sessions) {
    if (session.seat.empty()) continue;  // ssh and services have no seat
    if (!BoolProperty(bus, session.path.c_str(), kSession, "Active", &ok)) continue;
    console = true;
    locked |= BoolProperty(bus, session.path.c_str(), kSession, "LockedHint", &ok);
  }
  bool idle = BoolProperty(bus, kManagerPath, kManager, "IdleHint", &ok);
  uint64_t idle_since_us = U64Property(bus, kManagerPath, kManager, "IdleSinceHint", &ok);
  if (!ok) {
    bus_.reset();
    return Unknown(s, "logind: properties unreadable");
  }
  s->console_user.Set(console, now, name());
  s->screen_locked.Set(locked, now, name());
  s->media_playing.Set(inhibited, now, "logind idle inhibitors");
  if (console) {
    absl::Time last = idle && idle_since_us > 0 ? absl::FromUnixMicros(static_cast<int64_t>(idle_since_us)) : now;
    // Other sources (/dev/input) may have seen something later; keep the latest.
    if (!s->last_input.known() || s->last_input.source == name() || *s->last_input.value < last) {
      s->last_input.Set(last, now, name());
    }
  }
}

#else  // !MINIONS_HAVE_SDBUS

struct LogindProbe::Bus {};
LogindProbe::LogindProbe(std::string bus_address, int own_pid) : address_(std::move(bus_address)), own_pid_(own_pid) {}
LogindProbe::~LogindProbe() = default;
void LogindProbe::Fill(Snapshot* s, absl::Time now) { Unknown(s, "logind: built without sd-bus"); }

#endif

}  // namespace minions::availability
