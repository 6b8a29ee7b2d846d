// SIGINT / SIGTERM as a polite request: the first one sets a flag that long-running loops poll
// (finish the step, leave the round, exit 0); a second one ends the process at once.
#pragma once

namespace spes {

// Installs the handlers (idempotent).
void install_stop_signals();
// True once SIGINT or SIGTERM has arrived.
bool stop_requested();
// The signal that asked to stop (0 if none).
int stop_signal();

}  // namespace spes
