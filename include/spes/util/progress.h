// Human-readable numbers for progress lines: durations, counts, bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spes {

std::string format_duration(double seconds);  // "45s", "12m03s", "2h05m"
std::string format_count(double value);       // "950", "12.3k", "4.56M", "1.17B"
std::string format_bytes(double bytes);       // "512 B", "3.2 KiB", "1.95 GiB"
// "0,1,5" (expert lists and the like); `empty` when there is nothing.
std::string format_list(const std::vector<int>& values, const char* empty = "none");

}  // namespace spes
