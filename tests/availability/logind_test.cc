// The logind probe against python3-dbusmock's logind template on a private dbus-daemon: sessions
// on a seat, LockedHint, the manager's IdleHint/IdleSinceHint, and idle inhibitors of others.

#include <filesystem>
#include <memory>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "availability/logind_probe.h"
#include "common/subprocess.h"

namespace minions::availability {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

class Logind : public ::testing::Test {
 protected:
  void SetUp() override {
    // scripts/setup installs dbus-daemon and python3-dbusmock: a machine without them is not set up.
    ASSERT_TRUE(std::filesystem::exists("/usr/bin/dbus-daemon"))
        << "dbus-daemon is missing: run scripts/setup (Debian packages dbus-daemon, python3-dbusmock)";
    Subprocess::Options bus;
    bus.argv = {"dbus-daemon", "--session", "--nofork", "--print-address=1"};
    bus.stderr_path = "/dev/null";  // it complains it cannot raise its fd limit
    auto daemon = Subprocess::Start(bus);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    auto address = daemon_->ReadLine(absl::Seconds(10));
    ASSERT_TRUE(address.ok()) << address.status();
    address_ = *address;
    Subprocess::Options mock;
    mock.argv = {kPython, "-m", "dbusmock", "--system", "--template", "logind"};
    mock.extra_env = {"DBUS_SYSTEM_BUS_ADDRESS=" + address_};
    auto started = Subprocess::Start(mock);
    ASSERT_TRUE(started.ok()) << started.status();
    mock_ = std::move(*started);
    // Wait until logind answers on the bus.
    for (int i = 0; i < 100; ++i) {
      if (Send({"/org/freedesktop/login1", "org.freedesktop.login1.Manager.ListSessions"})) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "the logind mock did not come up (is python3-dbusmock installed? scripts/setup)";
  }

  // dbus-send to the mock; true when it answered.
  bool Send(std::vector<std::string> args) {
    Subprocess::Options sp;
    sp.argv = {"dbus-send", "--bus=" + address_, "--print-reply", "--dest=org.freedesktop.login1"};
    sp.argv.insert(sp.argv.end(), args.begin(), args.end());
    sp.stderr_path = "/dev/null";
    auto p = Subprocess::Start(sp);
    if (!p.ok()) return false;
    while ((*p)->ReadLine(absl::Seconds(5)).ok()) {
    }
    auto exit = (*p)->Wait(absl::Seconds(5));
    return exit.ok() && exit->exited && exit->code == 0;
  }

  // A probe of the mock, and what it says at `now` (in `s`).
  std::unique_ptr<LogindProbe> ProbeAt(absl::Time now, Snapshot* s) {
    auto probe = std::make_unique<LogindProbe>(address_, getpid());
    probe->Fill(s, now);
    return probe;
  }

  void SetManager(const std::string& property, const std::string& variant) {
    ASSERT_TRUE(Send({"/org/freedesktop/login1", "org.freedesktop.DBus.Properties.Set",
                      "string:org.freedesktop.login1.Manager", "string:" + property, "variant:" + variant}));
  }

  std::string address_;
  std::unique_ptr<Subprocess> daemon_, mock_;
};

TEST_F(Logind, NoSessionOnASeatMeansNoConsoleUser) {
  Snapshot s;
  const absl::Time now = absl::Now();
  ProbeAt(now, &s);
  ASSERT_TRUE(s.console_user.known()) << s.console_user.source;
  EXPECT_FALSE(*s.console_user.value);
  EXPECT_FALSE(s.last_input.known());
}

TEST_F(Logind, ConsoleSessionLockIdleAndInhibitors) {
  ASSERT_TRUE(Send({"/org/freedesktop/login1", "org.freedesktop.DBus.Mock.AddSession", "string:c1", "string:seat0",
                    "uint32:1000", "string:alice", "boolean:true"}));
  Snapshot s;
  const absl::Time now = absl::Now();
  std::unique_ptr<LogindProbe> probe = ProbeAt(now, &s);
  ASSERT_TRUE(s.console_user.known()) << s.console_user.source;
  EXPECT_TRUE(*s.console_user.value);
  EXPECT_FALSE(*s.screen_locked.value);
  EXPECT_FALSE(*s.media_playing.value);
  ASSERT_TRUE(s.last_input.known());
  EXPECT_EQ(*s.last_input.value, now) << "not idle-hinted: the owner counts as active now";

  // The desktop locks the screen and marks the seat idle since 12 minutes ago.
  ASSERT_TRUE(Send({"/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.SetLockedHint",
                    "boolean:true"}));
  absl::Time idle_since = absl::FromUnixSeconds(absl::ToUnixSeconds(now - absl::Minutes(12)));
  SetManager("IdleHint", "boolean:true");
  SetManager("IdleSinceHint", absl::StrCat("uint64:", absl::ToUnixMicros(idle_since)));
  probe->Fill(&s, now + absl::Seconds(1));
  EXPECT_TRUE(*s.screen_locked.value);
  EXPECT_EQ(*s.last_input.value, idle_since);

  // A video player takes an idle inhibitor (and holds its file descriptor).
  Subprocess::Options player;
  player.argv = {kPython, "-c",
                 "import dbus, sys, time\n"
                 "bus = dbus.bus.BusConnection(sys.argv[1])\n"
                 "m = dbus.Interface(bus.get_object('org.freedesktop.login1', '/org/freedesktop/login1'),"
                 " 'org.freedesktop.login1.Manager')\n"
                 "fd = m.Inhibit('idle', 'player', 'video', 'block')\n"
                 "print('held', flush=True)\n"
                 "time.sleep(60)\n",
                 address_};
  auto p = Subprocess::Start(player);
  ASSERT_TRUE(p.ok());
  auto line = (*p)->ReadLine(absl::Seconds(10));
  ASSERT_TRUE(line.ok() && *line == "held") << line.status();
  probe->Fill(&s, now + absl::Seconds(2));
  EXPECT_TRUE(*s.media_playing.value);
  EXPECT_EQ(s.media_playing.source, "logind idle inhibitors");
}

TEST_F(Logind, BusGoneIsUnknown) {
  LogindProbe probe("unix:path=/nonexistent/bus", getpid());
  Snapshot s;
  s.console_user.Set(true, absl::Now(), "old");
  probe.Fill(&s, absl::Now());
  EXPECT_FALSE(s.console_user.known());
  EXPECT_FALSE(s.media_playing.known());
  EXPECT_NE(s.console_user.source.find("logind"), std::string::npos);
}

}  // namespace
}  // namespace minions::availability
