// C interface of the SentencePiece shim module (libspes_sentencepiece.so).
//
// Why a shim: Debian's libsentencepiece carries its own copy of protobuf-lite and exports
// it, and libtorch (and gRPC) load the system libprotobuf; both in one global symbol scope
// crash at start-up. The tokenizer therefore loads this module with dlopen(RTLD_LOCAL |
// RTLD_DEEPBIND), so SentencePiece and its protobuf stay private to it. Strings returned
// through `char**` are malloc'ed and released with spes_sp_free_string.
#pragma once

#include <cstddef>

extern "C" {

// Returns a handle, or null with *error set.
void* spes_sp_load(const char* model_path, char** error);
void spes_sp_close(void* handle);
int spes_sp_piece_size(void* handle);
int spes_sp_eos_id(void* handle);
// *ids is malloc'ed (release with spes_sp_free_ids). Returns 0 on success.
int spes_sp_encode(void* handle, const char* text, std::size_t length, int** ids, std::size_t* count, char** error);
int spes_sp_decode(void* handle, const int* ids, std::size_t count, char** text, char** error);

// Trains a model from lines handed out by next_line (returns null at the end) with
// "key=value" options; writes the serialized model to *model (length *model_length).
typedef const char* (*spes_sp_next_line)(void* context, std::size_t* length);
int spes_sp_train(const char* const* options, std::size_t option_count, unsigned seed, spes_sp_next_line next_line,
                  void* context, char** model, std::size_t* model_length, char** error);

void spes_sp_free_string(char* s);
void spes_sp_free_ids(int* ids);
}
