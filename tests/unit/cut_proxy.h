// A TCP proxy on 127.0.0.1 for the sync tests: it forwards every connection to a target port and,
// once, cuts the connection (both ends closed) after it has carried `cut_after` bytes from the
// target back to the client — a link lost mid-transfer. Later connections pass through whole.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace spes::test {

class CutProxy {
 public:
  CutProxy(int target_port, std::uint64_t cut_after) : target_(target_port), cut_after_(cut_after) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr = loopback(0);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 16) != 0)
      throw std::runtime_error("cut proxy: cannot listen");
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~CutProxy() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard lock(mutex_);
    for (auto& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  CutProxy(const CutProxy&) = delete;
  CutProxy& operator=(const CutProxy&) = delete;

  int port() const { return port_; }
  bool cut() const { return cut_done_; }
  int connections() const { return connections_; }

 private:
  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }

  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in to = loopback(target_);
      if (::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      ++connections_;
      std::lock_guard lock(mutex_);
      pumps_.emplace_back([this, client, server] { pump(client, server); });
    }
  }

  // Copies bytes both ways until either side closes, the cut comes or the proxy stops.
  void pump(int client, int server) {
    std::vector<char> buf(16384);
    std::uint64_t down = 0;  // target -> client bytes on this connection
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      bool closed = false;
      for (int side = 0; side < 2 && !closed; ++side) {
        if (!(p[side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = side == 0 ? client : server, to = side == 0 ? server : client;
        std::size_t want = buf.size();
        const bool armed = side == 1 && !cut_done_;
        if (armed) want = static_cast<std::size_t>(std::min<std::uint64_t>(want, cut_after_ - down));
        const ssize_t got = ::read(from, buf.data(), want);
        if (got <= 0 || ::send(to, buf.data(), static_cast<std::size_t>(got), MSG_NOSIGNAL) != got) {
          closed = true;
          break;
        }
        if (side == 1) down += static_cast<std::uint64_t>(got);
        if (armed && down >= cut_after_) {
          cut_done_ = true;
          closed = true;
        }
      }
      if (closed) break;
    }
    ::shutdown(client, SHUT_RDWR);
    ::shutdown(server, SHUT_RDWR);
    ::close(client);
    ::close(server);
  }

  int target_;
  std::uint64_t cut_after_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, cut_done_{false};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::mutex mutex_;
  std::vector<std::thread> pumps_;
};

}  // namespace spes::test
