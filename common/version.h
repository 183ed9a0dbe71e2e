// The Chorus release every binary reports (`chorus version`, agent hello).
#ifndef CHORUS_COMMON_VERSION_H_
#define CHORUS_COMMON_VERSION_H_

namespace chorus {

inline constexpr char kVersion[] = "0.1.0";
// The API package every binary speaks.
inline constexpr char kApiVersion[] = "chorus.v1";

}  // namespace chorus

#endif  // CHORUS_COMMON_VERSION_H_
